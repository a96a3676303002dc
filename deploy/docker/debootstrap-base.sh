#!/bin/sh
# A Debian base image for Weir's Dockerfiles, built without any registry: debootstrap a
# minimal Debian into a folder, add this machine's trusted CAs, and `docker import` it.
#
#   sudo deploy/docker/debootstrap-base.sh                       # weir-base:bookworm
#   sudo deploy/docker/debootstrap-base.sh -t my-base:1 redis-server   # more packages
#   docker build -f deploy/docker/Dockerfile --build-arg BASE_IMAGE=weir-base:bookworm \
#       -t weir:0.1.0 .
#
# The image holds python3 with venv and pip, ca-certificates (with every CA of this machine's
# /usr/local/share/ca-certificates, so a TLS-inspecting proxy it trusts is trusted inside
# too) and whatever packages are named after the options. It runs as root, needs debootstrap
# (Debian's package) and a Docker engine (DOCKER_HOST is honoured), and downloads Debian's
# packages from the mirror only.
#
# Options: -t TAG (weir-base:<suite>), -s SUITE (bookworm), -m MIRROR
# (http://deb.debian.org/debian), -w WORKDIR (a new folder under TMPDIR, removed at the end).
set -eu

suite=bookworm
mirror=http://deb.debian.org/debian
tag=
workdir=
while getopts t:s:m:w: option; do
    case "$option" in
        t) tag=$OPTARG ;;
        s) suite=$OPTARG ;;
        m) mirror=$OPTARG ;;
        w) workdir=$OPTARG ;;
        *) echo "usage: $0 [-t TAG] [-s SUITE] [-m MIRROR] [-w WORKDIR] [PACKAGE...]" >&2
           exit 2 ;;
    esac
done
shift $((OPTIND - 1))
tag=${tag:-weir-base:$suite}

if [ "$(id -u)" -ne 0 ]; then
    echo "$0: debootstrap needs root" >&2
    exit 1
fi
command -v debootstrap >/dev/null || { echo "$0: install debootstrap first" >&2; exit 1; }

packages=python3,python3-venv,python3-pip,ca-certificates
for package in "$@"; do
    packages=$packages,$package
done

if [ -z "$workdir" ]; then
    workdir=$(mktemp -d "${TMPDIR:-/tmp}/weir-base.XXXXXX")
    trap 'rm -rf "$workdir"' EXIT
fi
rootfs=$workdir/rootfs

debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror"

# This machine's own CAs (a proxy's, a company's), then the bundle rebuilt inside.
if [ -d /usr/local/share/ca-certificates ]; then
    cp -R /usr/local/share/ca-certificates/. "$rootfs/usr/local/share/ca-certificates/"
fi
chroot "$rootfs" update-ca-certificates >/dev/null

# What an image needs no copy of: downloaded packages, package lists, logs.
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* "$rootfs"/tmp/*

tar -C "$rootfs" --numeric-owner -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    - "$tag" >/dev/null
echo "$tag"
