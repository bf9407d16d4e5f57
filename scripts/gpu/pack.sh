#!/usr/bin/env bash
# Builds the GPU-check bundle: everything `scripts/gpu/run_on_gpu.sh` needs on a GPU machine
# that has no Rust toolchain and no network, in at most 64 MiB (scripts/gpu/README.md).
#
#   scripts/gpu/pack.sh [--out DIR] [--no-build] [--features LIST] [--no-tree-check] [--python PY]
#                       [--vulkan-loader]
#
#   --out DIR        the bundle folder (default target/gpu-pack; relative to the repository
#                    root; emptied first). Keep it under target/ (git-ignored) so that the
#                    device tool can carry it.
#   --no-build       use target/release/infembed as it is (built when it is missing);
#                    $CARGO_TARGET_DIR, when set, replaces target/ (a second build, e.g.
#                    with fusion, kept in its own folder)
#   --features LIST  cargo features of the build (default: wgpu; `wgpu,fusion` for burn's
#                    operation fusion, docs/devices.md)
#   --no-tree-check  a self-contained bundle: only it counts against 64 MiB, and it holds
#                    every file it needs. By default the repository's working tree, which the
#                    device tool sends along with the carried bundle, counts too, and files
#                    that git tracks unmodified (the training data) stay out of the bundle:
#                    from-tree.txt names them with their sha256, and run_on_gpu.sh copies
#                    them from the tree above the bundle
#   --python PY      a Python with numpy (and, preferably, safetensors) for the float16
#                    conversion (default: $PYTHON, else python3)
#   --vulkan-loader  also carry the Debian packages of the Vulkan loader and GLVND (libvulkan1,
#                    libglvnd0, libglx0, libgl1, libegl1, libgles2, libopengl0; amd64, about
#                    370 KB, fetched with apt-get download) in gl/, for GPU machines whose
#                    driver comes without the Vulkan loader (run_on_gpu.sh unpacks them there
#                    only when the libraries are missing)
#
# Layout (repository-relative, so that the quickstart config's paths resolve from the bundle
# root): infembed.xz, models/all-MiniLM-L6-v2/ (float16 weights + WEIGHTS_ARE_F16.txt),
# examples/configs/quickstart.toml, the data files it names (not data/msmarco-subset/: the
# check runs `infembed train` on the config, not the quickstart command, and the bundle needs
# the room), scripts/gpu/, scripts/train/bench_torch.py (PyTorch's
# training step), gl/ (with --vulkan-loader), bundle.json (sizes, sha256, commit),
# from-tree.txt (the files left to the working tree; see --no-tree-check).
set -euo pipefail

LIMIT=67108864 # 64 MiB: what the device tool carries
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="$ROOT/target/gpu-pack"
BUILD=1
TREE_CHECK=1
LOADER=0
FEATURES=wgpu
PY="${PYTHON:-python3}"
MODEL_REL=models/all-MiniLM-L6-v2
CONFIG_REL=examples/configs/quickstart.toml

die() {
    echo "pack.sh: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
        --out)
            [ $# -ge 2 ] || die "--out needs a folder"
            OUT="$2"
            shift 2
            ;;
        --no-build)
            BUILD=0
            shift
            ;;
        --no-tree-check)
            TREE_CHECK=0
            shift
            ;;
        --vulkan-loader)
            LOADER=1
            shift
            ;;
        --features)
            [ $# -ge 2 ] || die "--features needs a list"
            FEATURES="$2"
            shift 2
            ;;
        --python)
            [ $# -ge 2 ] || die "--python needs an interpreter"
            PY="$2"
            shift 2
            ;;
        -h | --help)
            awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "${BASH_SOURCE[0]}"
            exit 0
            ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

cd "$ROOT"
case "$OUT" in
    /*) ;;
    *) OUT="$ROOT/$OUT" ;;
esac
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/infembed"

# ---- checks before anything is built or deleted
[ -f "$MODEL_REL/model.safetensors" ] || die "$MODEL_REL/model.safetensors is missing (cargo xtask fetch-model)"
[ -f "$CONFIG_REL" ] || die "$CONFIG_REL is missing"
"$PY" -c 'import numpy' 2>/dev/null ||
    die "$PY has no numpy: give --python (or PYTHON=) a Python with numpy and safetensors"
"$PY" -c 'import safetensors' 2>/dev/null ||
    echo "pack.sh: note: $PY has no safetensors package; the built-in writer is used" >&2
if command -v xz >/dev/null 2>&1; then
    COMPRESS=xz
elif command -v gzip >/dev/null 2>&1; then
    COMPRESS=gzip
else
    die "neither xz nor gzip is installed"
fi
if command -v strip >/dev/null 2>&1; then
    STRIP="strip"
elif command -v objcopy >/dev/null 2>&1; then
    STRIP="objcopy"
else
    die "neither strip nor objcopy is installed (binutils)"
fi

# ---- the binary
if [ "$BUILD" = 1 ] || [ ! -x "$BIN" ]; then
    echo "pack.sh: cargo build --release -p infembed --no-default-features --features $FEATURES" >&2
    cargo build --release -p infembed --no-default-features --features "$FEATURES"
fi
[ -x "$BIN" ] || die "$BIN was not built"
"$BIN" --help | grep -q '^  devices' ||
    die "$BIN has no 'devices' command: it predates the device support (rebuild without --no-build)"

# ---- the bundle folder: emptied, but only if it is one of ours (or empty)
if [ -e "$OUT" ]; then
    if [ -f "$OUT/bundle.json" ] || [ -z "$(ls -A "$OUT")" ]; then
        rm -rf "$OUT"
    else
        die "$OUT exists and is not a GPU bundle (no bundle.json): refusing to empty it"
    fi
fi
mkdir -p "$OUT"

echo "pack.sh: stripping ($STRIP) and compressing ($COMPRESS) the binary" >&2
TMPBIN="$OUT/.infembed.stripped"
if [ "$STRIP" = strip ]; then
    strip -o "$TMPBIN" "$BIN"
else
    objcopy --strip-all "$BIN" "$TMPBIN"
fi
if [ "$COMPRESS" = xz ]; then
    # x86 branch filter first: about 1.5% smaller than plain -9 on this binary
    xz --x86 --lzma2=preset=9 -T1 -c "$TMPBIN" >"$OUT/infembed.xz"
else
    gzip -9 -c "$TMPBIN" >"$OUT/infembed.gz"
fi
STRIPPED_BYTES=$(stat -c %s "$TMPBIN")
rm -f "$TMPBIN"

# ---- the model: every file as it is, but the weights in float16
echo "pack.sh: model $MODEL_REL (weights to float16)" >&2
mkdir -p "$OUT/$MODEL_REL"
(cd "$MODEL_REL" && find . -type f ! -name model.safetensors ! -name .gitattributes -print0 |
    while IFS= read -r -d '' f; do
        mkdir -p "$OUT/$MODEL_REL/$(dirname "$f")"
        cp -p "$f" "$OUT/$MODEL_REL/$f"
    done)
NARROW_JSON=$("$PY" scripts/gpu/gpu_check.py narrow "$MODEL_REL/model.safetensors" \
    "$OUT/$MODEL_REL/model.safetensors")
echo "pack.sh: $NARROW_JSON" >&2
if [ "$COMPRESS" = xz ]; then
    # float16 weights still shrink by about a tenth (45.4 -> 40.8 MB); run_on_gpu.sh's setup
    # (gpu_check.py widen) unpacks them with Python's lzma
    xz -6 -T2 "$OUT/$MODEL_REL/model.safetensors"
fi

# ---- the training config and the files it names
# With the tree check on, the bundle travels with the working tree (the device tool sends
# both), so a file that git tracks unmodified is not copied twice: it is named in
# from-tree.txt (sha256sum's format) and run_on_gpu.sh copies it from the repository there.
FROM_TREE="$OUT/from-tree.txt"
in_tree() { # is repository-relative file $1 tracked and unmodified?
    [ "$TREE_CHECK" = 1 ] && [ -f "$1" ] &&
        git -C "$ROOT" ls-files --error-unmatch -- "$1" >/dev/null 2>&1 &&
        GIT_OPTIONAL_LOCKS=0 git -C "$ROOT" diff --quiet HEAD -- "$1" 2>/dev/null
}
copy_rel() { # copy repository-relative files or folders into the bundle
    local p
    for p in "$@"; do
        [ -e "$p" ] || die "$p is missing"
        mkdir -p "$OUT/$(dirname "$p")"
        cp -pR "$p" "$OUT/$(dirname "$p")/"
    done
}
copy_or_name() { # copy_rel, except that files the tree carries are named in from-tree.txt
    local p
    for p in "$@"; do
        if in_tree "$p"; then
            sha256sum -- "$p" >>"$FROM_TREE"
        else
            copy_rel "$p"
        fi
    done
}
# The data files the config names (top-level string values under [data]).
mapfile -t DATA_FILES < <(sed -n '/^\[data\]/,/^\[/p' "$CONFIG_REL" |
    sed -n 's/^[[:space:]]*[a-z_]*[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p')
[ "${#DATA_FILES[@]}" -gt 0 ] || die "found no data file in [data] of $CONFIG_REL"
copy_or_name "$CONFIG_REL" "${DATA_FILES[@]}"
for extra in data/PROVENANCE.md data/inf-ir-sample/README.md; do
    if [ -e "$extra" ]; then copy_or_name "$extra"; fi
done

# ---- the scripts (always in the bundle: they are what runs there)
copy_rel scripts/gpu/run_on_gpu.sh scripts/gpu/README.md scripts/train/bench_torch.py
for f in scripts/gpu/*.py; do copy_rel "$f"; done

# ---- the Vulkan loader and GLVND's libraries (Debian packages, amd64), for GPU
# machines whose driver has no loader installed; run_on_gpu.sh unpacks them only when missing
if [ "$LOADER" = 1 ]; then
    command -v apt-get >/dev/null 2>&1 || die "--vulkan-loader needs apt-get (Debian/Ubuntu)"
    mkdir -p "$OUT/gl" "$OUT/.apt-lists/partial"
    apt_opts=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64
        "-oDir::State::Lists=$OUT/.apt-lists")
    apt-get "${apt_opts[@]}" update >/dev/null 2>&1 || die "apt-get update failed"
    # libvulkan1 and libglvnd0 alone were not enough on an H200 machine (no adapter); the
    # whole set was (measured 2026-11-26, scripts/gpu/README.md)
    (cd "$OUT/gl" && apt-get "${apt_opts[@]}" download libvulkan1 libglvnd0 libglx0 libgl1 \
        libegl1 libgles2 libopengl0 >/dev/null 2>&1) ||
        die "apt-get download of the Vulkan loader and GLVND packages failed"
    rm -rf "$OUT/.apt-lists"
    echo "pack.sh: Vulkan loader packages: $(cd "$OUT/gl" && ls | paste -sd ' ' -)" >&2
fi
find "$OUT/scripts" -name __pycache__ -prune -exec rm -rf {} +

# ---- manifest
COMMIT=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
# (GIT_OPTIONAL_LOCKS=0: read only, no index refresh)
DIRTY=$(GIT_OPTIONAL_LOCKS=0 git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l || echo 0)
VERSION=$("$BIN" --version 2>/dev/null || echo unknown)
"$PY" scripts/gpu/gpu_check.py bundle-manifest "$OUT" \
    --set "commit=$COMMIT" --set "modified_tracked_files=$DIRTY" \
    --set "infembed_version=$VERSION" --set "features=$FEATURES" \
    --set "binary_stripped_bytes=$STRIPPED_BYTES" --set "compression=$COMPRESS" \
    --set "weights=$NARROW_JSON"

# ---- size
TOTAL=$(find "$OUT" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
echo "pack.sh: largest files:" >&2
(cd "$OUT" && find . -type f -printf '%s\t%P\n' | sort -rn | head -8 |
    awk -F'\t' '{printf "  %10.2f MiB  %s\n", $1 / 1048576, $2}') >&2
printf 'pack.sh: bundle %s: %d bytes (%.2f MiB) in %d files; limit %d bytes (64 MiB)\n' \
    "$OUT" "$TOTAL" "$(awk -v t="$TOTAL" 'BEGIN {print t / 1048576}')" \
    "$(find "$OUT" -type f | wc -l)" "$LIMIT"
if [ "$TOTAL" -gt "$LIMIT" ]; then
    echo "pack.sh: FAILED: the bundle exceeds 64 MiB" >&2
    exit 1
fi
# The device tool sends the working tree (tracked and untracked-not-ignored files) with the
# carried paths, 64 MiB in all.
if [ "$TREE_CHECK" = 1 ] && git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    TREE=$(cd "$ROOT" && GIT_OPTIONAL_LOCKS=0 git ls-files -z --cached --others --exclude-standard |
        xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
    printf 'pack.sh: working tree %d bytes (%.2f MiB); bundle + tree %.2f MiB\n' "$TREE" \
        "$(awk -v t="$TREE" 'BEGIN {print t / 1048576}')" \
        "$(awk -v t="$((TREE + TOTAL))" 'BEGIN {print t / 1048576}')"
    if [ "$((TREE + TOTAL))" -gt "$LIMIT" ]; then
        echo "pack.sh: FAILED: bundle + working tree exceed the device tool's 64 MiB (--no-tree-check to ignore)" >&2
        exit 1
    fi
fi
