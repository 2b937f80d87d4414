# LOCAL STAND-IN for redis:7.2, for `make test-compose` on a machine that cannot
# pull images: Debian bookworm (debootstrap --variant=minbase, imported as the
# base below by build.sh) with Debian's redis-server 7.0 and redis-cli on PATH,
# the `redis` user, /data owned by it as the working directory, and an
# entrypoint that behaves like the official one (options or a .conf first:
# redis-server; root running redis-server: drops to `redis`; else runs the
# command). It is NOT the official image; a machine that can pull uses the real one.
FROM stepbarrier-standin-base:bookworm

ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server redis-tools \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data \
    && chown redis:redis /data \
    && redis-server --version
COPY redis-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
VOLUME /data
WORKDIR /data
ENTRYPOINT ["docker-entrypoint.sh"]
EXPOSE 6379
CMD ["redis-server"]
