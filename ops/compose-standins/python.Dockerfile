# LOCAL STAND-IN for python:3.11-slim, for `make test-compose` on a machine that
# cannot pull images: Debian bookworm (debootstrap --variant=minbase, imported as
# the base below by build.sh) with Debian's Python 3.11 in a venv first on PATH,
# as the official image has `python` and `pip` first on PATH. It is NOT the
# official image; a machine that can pull uses the real one.
FROM stepbarrier-standin-base:bookworm

ENV LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /usr/local/python \
    && /usr/local/python/bin/python -c "import sys; assert sys.version_info[:2] == (3, 11), sys.version"
# pip reaches the package index only through the host's CA bundle (build.sh copies
# it into the build context)
COPY host-ca-certificates.crt /usr/local/share/stepbarrier-standin/ca-certificates.crt
ENV PATH=/usr/local/python/bin:$PATH \
    PIP_CERT=/usr/local/share/stepbarrier-standin/ca-certificates.crt
CMD ["python3"]
