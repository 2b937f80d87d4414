"""A redis-server whose wall clock is shifted: an ``LD_PRELOAD`` shim built with gcc.

    shim = build_clock_shim(tmp_dir)          # None (with the reason) without gcc
    server = ClockShiftedRedisServer(shim)    # a tests.redis_harness.RedisServer
    server.shift = -3600.0                    # Redis's TIME an hour behind...
    server.restart_empty()                    # ...from this (re)start on

The shim overrides ``clock_gettime`` (the realtime clocks only), ``gettimeofday``
and ``time`` and adds ``CLOCK_SHIM_SHIFT_SECONDS`` (a float, negative: behind) to
what they return; monotonic clocks are left alone, so Redis's timers and expiries
run as usual. It stands for a Redis that fails over to (or restarts on) a machine
whose clock is behind: the stepbarrier scripts number generations and make beats
from Redis's ``TIME`` (issue 32, case 6).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.redis_harness import RedisServer

SHIFT_VARIABLE = "CLOCK_SHIM_SHIFT_SECONDS"

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

/* CLOCK_SHIM_SHIFT_SECONDS (seconds, may be fractional and negative) is added to
   the realtime clock; monotonic clocks are untouched. */
static long long shift_ns(void) {
    static int read = 0;
    static long long ns = 0;
    if (!read) {
        const char *text = getenv("CLOCK_SHIM_SHIFT_SECONDS");
        ns = text ? (long long)(strtod(text, NULL) * 1e9) : 0;
        read = 1;
    }
    return ns;
}

static void shift(struct timespec *ts) {
    long long total = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + shift_ns();
    ts->tv_sec = total / 1000000000LL;
    ts->tv_nsec = total % 1000000000LL;
    if (ts->tv_nsec < 0) { ts->tv_nsec += 1000000000LL; ts->tv_sec -= 1; }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *) = 0;
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int result = real(id, ts);
    if (result == 0 && ts && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shift(ts);
    return result;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    int result = clock_gettime(CLOCK_REALTIME, &ts);
    if (result == 0 && tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    (void)tz;
    return result;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
"""


class ShimUnavailable(RuntimeError):
    """The shim cannot be built here (no C compiler)."""


def build_clock_shim(directory: Path) -> Path:
    """Build the shim into ``directory``; its path.

    Raises:
        ShimUnavailable: No ``gcc`` (the reason is the message).
        subprocess.CalledProcessError: gcc failed (a real error).
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ShimUnavailable("gcc is not installed: no LD_PRELOAD clock shim can be built")
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "clock_shim.c"
    library = directory / "clock_shim.so"
    source.write_text(SOURCE)
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-o", str(library), str(source), "-ldl"],
        check=True,
        capture_output=True,
    )
    return library


class ClockShiftedRedisServer(RedisServer):
    """A ``RedisServer`` whose wall clock is ``shift`` seconds off (``0``: its own).

    The shift takes effect at the next (re)start: set it, then ``restart_empty()``.

    Args:
        shim: The built shim (``build_clock_shim``); ``None``: never shifted.
    """

    def __init__(self, shim: Path | None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.shim = shim
        self.shift = 0.0

    def start(self, wait: bool = True) -> ClockShiftedRedisServer:
        env = dict(os.environ)
        if self.shift:
            if self.shim is None:
                raise ShimUnavailable("no clock shim was built")
            env["LD_PRELOAD"] = str(self.shim)
            env[SHIFT_VARIABLE] = repr(self.shift)
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
        )
        if wait:
            self.wait_ready()
        return self
