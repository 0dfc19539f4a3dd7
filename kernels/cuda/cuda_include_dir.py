#!/usr/bin/env python3
"""cuda_include_dir.py — the include folder of the toolkit an nvcc belongs to.

Run by meson (kernels/meson.build) at setup time:

    cuda_include_dir.py NVCC [ARGS...]

prints the folder that holds cuda_runtime.h for the toolkit NVCC runs, as
nvcc itself reports it (`nvcc --dryrun`: its INCLUDES, else TOP/include),
with links resolved. The nvcc found on PATH may be a link or a wrapper
script outside the toolkit (/usr/local/bin/nvcc running
/usr/local/cuda-13.0/bin/nvcc), so its own path says nothing. Exits 1 with
a message when nvcc reports no such folder.
"""
import os
import shlex
import subprocess
import sys


def main(argv):
    nvcc = argv[1:]
    run = subprocess.run(nvcc + ["--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, check=False)
    found = []
    top = None
    for line in run.stdout.splitlines():
        line = line.lstrip("#$ ").strip()
        if line.startswith("INCLUDES="):
            for word in shlex.split(line[len("INCLUDES="):]):
                if word.startswith("-I") and len(word) > 2:
                    found.append(word[2:])
        elif line.startswith("TOP="):
            top = line[len("TOP="):].strip().strip('"')
    if top:
        found.append(os.path.join(top, "include"))
    for folder in found:
        if os.path.isfile(os.path.join(folder, "cuda_runtime.h")):
            print(os.path.realpath(folder))
            return 0
    sys.stderr.write("cuda_include_dir.py: '%s --dryrun' names no folder holding cuda_runtime.h "
                     "(it printed: %s)\n" % (" ".join(nvcc), run.stdout.strip()[:400]))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
