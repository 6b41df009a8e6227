#!/bin/sh
# PyTorch 2 on CPU without the internet: Debian trixie's python3-torch (2.6) in a chroot beside this
# bookworm machine, its package archive the only network it needs. Run as root:
#   validation/torch2-chroot.sh setup                 # once: debootstrap and packages (minutes)
#   validation/torch2-chroot.sh run python3 validation/compile_partitioner.py ...
# The checkout is bind-mounted at /work/main inside; commands run from there. Validation only:
# nothing in the build or the tests needs it (their committed results are read as files).
set -eu
ROOT=${TORCH2_CHROOT:-/opt/trixie}
HERE=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-}" in
setup)
    apt-get install -y -q debootstrap
    [ -x "$ROOT/usr/bin/apt-get" ] || debootstrap --variant=minbase trixie "$ROOT" http://deb.debian.org/debian
    cp /etc/resolv.conf "$ROOT/etc/"
    # inductor compiles C++ against libtorch's headers; the partitioner imports networkx
    chroot "$ROOT" sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends python3-torch libtorch-dev g++ python3-dev python3-setuptools \
        python3-networkx python3-sympy python3-filelock python3-jinja2"
    ;;
run)
    shift
    mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
    mkdir -p "$ROOT/work/main"
    mountpoint -q "$ROOT/work/main" || mount --bind "$HERE" "$ROOT/work/main"
    mountpoint -q "$ROOT/tmp" || mount -t tmpfs tmpfs "$ROOT/tmp"
    exec chroot "$ROOT" sh -c 'cd /work/main && exec "$@"' sh "$@"
    ;;
*)
    echo "usage: $0 setup | run COMMAND..." >&2
    exit 2
    ;;
esac
