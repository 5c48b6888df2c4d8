#!/usr/bin/env bash
# What a lent GPU machine needs to serve (GPU.md item 3) that it does not have, packed into
# .gpu/ for the device tool's `carry` (64 MiB a call, the tree included): tritonserver from this
# environment's nvidia-pytriton wheel (the binary, the Python backend, the stubs for Python
# 3.10-3.13 and its bundled libraries less the 3.13 libpython: 27 MB as tar.xz), and the wheels
# the benchmark's client needs for Python 3.12 (tritonclient with grpcio, protobuf and
# python-rapidjson), with this checkout's own wheel (specdec and specdec_client, as installed).
#
#   bash benchmarks/pack_server.sh     # then, through the device tool, carrying .gpu:
#                                      #   bash benchmarks/gpu_checklist.sh served
#   PYSPY=1 bash benchmarks/pack_server.sh     # and py-spy (the served run then profiles)
#   PYVER=3.11 bash benchmarks/pack_server.sh   # wheels for a dry run here (the tar.xz is kept:
#                                               # delete it to pack tritonserver again)
#
# The server is found through `import pytriton` (specdec/launcher/launch.py): the pack holds an
# empty pytriton/__init__.py beside tritonserver/, so the client half of pytriton (and its
# dependencies) need not travel.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
pyver=${PYVER:-3.12}   # the GPU machine's python3 (KINDS.md: 3.12.3)
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
mkdir -p .gpu

pack_tritonserver() {
    local site work
    site=$($py -c 'import pathlib, pytriton; print(pathlib.Path(pytriton.__file__).parents[1])')
    work=$(mktemp -d)
    mkdir -p "$work/pytriton/tritonserver/python_backend_stubs" "$work/nvidia_pytriton.libs"
    touch "$work/pytriton/__init__.py"
    cp -r "$site"/pytriton/tritonserver/{bin,backends,caches} "$work/pytriton/tritonserver/"
    rm -rf "$work/pytriton/tritonserver/backends/python/__pycache__"
    for v in 3.10 3.11 3.12 3.13; do
        cp -r "$site/pytriton/tritonserver/python_backend_stubs/$v" \
            "$work/pytriton/tritonserver/python_backend_stubs/"
    done
    cp "$site"/nvidia_pytriton.libs/* "$work/nvidia_pytriton.libs/"
    rm -f "$work"/nvidia_pytriton.libs/libpython3-*.13.so*   # the 3.13 stub's: 31 MB
    echo "packing tritonserver (about 90 s)"
    tar -C "$work" -cJf .gpu/pytriton-server.tar.xz .
    rm -rf "$work"
}

if [ -f .gpu/pytriton-server.tar.xz ]; then
    echo "keeping .gpu/pytriton-server.tar.xz"
else
    pack_tritonserver
fi
rm -f .gpu/*.whl
# numpy<2, as nvidia-pytriton requires: under numpy 2.5 the 2.51 stub handed a model every
# input tensor as its first byte repeated (seen on the H200, 2026-11-26). 18 MB: with it the
# pack passes 64 MiB beside the tree, unless the default models' weights stay behind (see
# docs/benchmarks.md, "Served on a GPU").
for spec in tritonclient==2.73.0 python-rapidjson==1.25 grpcio==1.85.1 protobuf==6.33.6 \
        numpy==1.26.4; do
    $py -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .gpu "$spec"
done
$py -m pip wheel -q --no-deps --no-build-isolation . -w .gpu
# PYSPY=1: py-spy for the served run's profiles, stripped and compressed (8 MB -> 1.8 MB)
rm -f .gpu/py-spy.xz
if [ "${PYSPY:-0}" = 1 ]; then
    [ -x "$(dirname "$py")/py-spy" ] || $py -m pip install -q py-spy==0.4.3
    spy=$(mktemp)
    cp "$(dirname "$py")/py-spy" "$spy" && strip "$spy" && xz -9 -c "$spy" > .gpu/py-spy.xz
    rm -f "$spy"
fi
du -ch .gpu/* | tail -1
