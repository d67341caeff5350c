"""Peak memory of one command, measured in a process of its own."""

from __future__ import annotations

import subprocess
import sys


def peak_rss_kib(args: list[str]) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run the CLI with `args` in a process of its own; it and the peak RSS (KiB) of that
    process alone, which it reports as it exits (VmHWM: unlike ru_maxrss it does not carry
    the forking test process's size across exec)."""
    code = ("import atexit, re, sys\n"
            "atexit.register(lambda: sys.stderr.write('\\nMAXRSS %s\\n' % re.search("
            "r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)))\n"
            "sys.argv = ['tracklake', *sys.argv[1:]]\n"
            "from tracklake._cli.main import main\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=300)
    peak = int(proc.stderr.rsplit("MAXRSS ", 1)[1].split()[0])
    return proc, peak
