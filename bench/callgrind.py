"""User-space instruction counts with Callgrind, cut at points the measured code marks.

Wall-clock figures on 2 shared cores swing with whatever else runs; the number
of instructions a piece of code executes does not (within a few per cent:
what differs between runs is the garbage collector's timing and the odd
branch on a clock). ``bench.instructions`` runs each measured process under
``valgrind --tool=callgrind`` and has the process itself mark where each
measured region begins and ends:

* ``Marks.dump(label)`` issues Callgrind's ``CALLGRIND_DUMP_STATS_AT`` client
  request: Callgrind writes the instructions counted since the previous dump,
  every thread of the process summed, to a new file whose ``desc: Trigger``
  line names ``label``, and starts counting from zero again. A region is then
  the dump at its end; what ran before its start is in earlier dumps. No
  start-up, import or set-up cost ever lands in a region.
* Python cannot issue a client request itself (it is a magic sequence of
  machine instructions, ``valgrind.h``'s ``VALGRIND_DO_CLIENT_REQUEST``), and no
  compiler or header is needed for it either: the sequence is 29 bytes of
  x86-64 code, mapped executable and called through ``ctypes``. Outside
  Valgrind the sequence does nothing and returns 0 (``Marks.on_valgrind``).
* A dump costs the measured process the ``ctypes`` call around it (a few
  thousand instructions): every part measures empty regions (two dumps back
  to back) in the same process and subtracts their median from every region.

Only x86-64 Linux is supported (the machine code above); elsewhere
``Marks`` raises ``RuntimeError`` and the benchmark says so.
"""

from __future__ import annotations

import ctypes
import mmap
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.harness import ROOT, child_env

_CODE = bytes.fromhex(
    "4889f8"  # mov rax, rdi: the request's block of six words
    "4889f2"  # mov rdx, rsi: the result outside Valgrind
    "48c1c703" "48c1c70d" "48c1c73d" "48c1c733"  # rol rdi by 3, 13, 61, 51: the preamble
    "4887db"  # xchg rbx, rbx: the request (rdx = request(rax))
    "4889d0"  # mov rax, rdx
    "c3"  # ret
)  # fmt: skip
"""``valgrind.h``'s ``VALGRIND_DO_CLIENT_REQUEST_EXPR`` for amd64, as a function
``unsigned long request(unsigned long block[6], unsigned long default)``."""

_RUNNING_ON_VALGRIND = 0x1001
_DUMP_STATS_AT = 0x43540003  # VG_USERREQ_TOOL_BASE('C','T') + 3 (callgrind.h)


class Marks:
    """Callgrind dumps issued from Python (see the module's docstring).

    One per process; the labels are made once (``label`` objects are reused,
    so a dump allocates nothing).
    """

    def __init__(self) -> None:
        if platform.machine() not in ("x86_64", "AMD64"):
            raise RuntimeError(
                f"bench.callgrind issues Valgrind client requests as x86-64 code; this "
                f"machine is {platform.machine()}"
            )
        self._page = mmap.mmap(
            -1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
        )
        self._page.write(_CODE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._page))
        prototype = ctypes.CFUNCTYPE(ctypes.c_ulong, ctypes.POINTER(ctypes.c_ulong), ctypes.c_ulong)
        self.request = prototype(address)
        """``request(block, 0)``: issue the request ``block`` (see ``block``) at once."""
        self._blocks: dict[
            str, tuple[ctypes.Array[ctypes.c_ulong], ctypes.Array[ctypes.c_char]]
        ] = {}
        probe = (ctypes.c_ulong * 6)(_RUNNING_ON_VALGRIND, 0, 0, 0, 0, 0)
        self.on_valgrind = bool(self.request(probe, 0))

    def block(self, label: str) -> ctypes.Array[ctypes.c_ulong]:
        """The request block that dumps with ``label`` (made once per label)."""
        made = self._blocks.get(label)
        if made is None:
            text = ctypes.create_string_buffer(label.encode())
            words = (ctypes.c_ulong * 6)(_DUMP_STATS_AT, ctypes.addressof(text), 0, 0, 0, 0)
            made = self._blocks[label] = (words, text)
        return made[0]

    def dump(self, label: str) -> None:
        """End a region: Callgrind writes what was counted since the last dump."""
        self.request(self.block(label), 0)


@dataclass(frozen=True)
class Dump:
    """One dump: its label (``""`` for the one at exit) and the instructions in it."""

    label: str
    instructions: int


_TRIGGER = re.compile(r"^desc: Trigger: (?:Client Request: (.*)|Program termination)$")


def read_dumps(directory: Path, pid: int) -> list[Dump]:
    """The dumps of process ``pid`` in ``directory``, in order (the files are removed).

    Callgrind names them ``callgrind.<pid>.<n>`` (the exit's ``callgrind.<pid>``);
    each has a ``desc: Trigger`` line and a ``summary:`` (or ``totals:``) line.
    """
    numbered: list[tuple[int, Path]] = []
    for path in directory.glob(f"callgrind.{pid}*"):
        suffix = path.name.removeprefix(f"callgrind.{pid}")
        numbered.append((int(suffix[1:]) if suffix else 1 << 30, path))
    dumps = []
    for _, path in sorted(numbered):
        label, total = "", None
        with path.open() as lines:
            for line in lines:
                found = _TRIGGER.match(line.rstrip("\n"))
                if found:
                    label = found.group(1) or ""
                elif line.startswith(("summary:", "totals:")) and total is None:
                    total = int(line.split()[1])
        path.unlink()
        if total is None:
            raise RuntimeError(f"no summary in {path}")
        dumps.append(Dump(label, total))
    return dumps


def valgrind() -> str:
    """The ``valgrind`` binary; how to install it if it is missing."""
    found = shutil.which("valgrind")
    if found is None:
        raise RuntimeError(
            "valgrind is missing: `make bench` installs it as root (apt-get install "
            "valgrind); else install it (Debian/Ubuntu: sudo apt-get install valgrind)"
        )
    return found


def valgrind_version() -> str:
    return subprocess.run(
        [valgrind(), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()


def start_under_callgrind(
    directory: Path, module: str, *args: str, **env: str
) -> subprocess.Popen[str]:
    """Start ``python -m module args`` under Callgrind, its dumps in ``directory``.

    Its stdin and stdout are pipes (the measured process and this one talk over
    them); ``PYTHONHASHSEED=0`` makes its dictionaries' layout the same in
    every run.
    """
    command = [
        valgrind(),
        "--tool=callgrind",
        "--quiet",
        f"--callgrind-out-file={directory}/callgrind.%p",
        sys.executable,
        "-m",
        module,
        *args,
    ]
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        env=child_env(PYTHONHASHSEED="0", **env),
        cwd=str(ROOT),
    )
