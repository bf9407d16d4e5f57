#!/usr/bin/env bash
# The GPU check, run from a bundle made by scripts/gpu/pack.sh (scripts/gpu/README.md).
# Needs bash, Python 3 (numpy, torch; safetensors optional) and the GPU's driver; no Rust, no
# network.
#
#   bash scripts/gpu/run_on_gpu.sh [options]       (from the bundle root, or anywhere)
#
#   --device D              infembed's device: wgpu (default), vulkan, cpu (wgpu:N, ... too)
#   --out FILE              the results JSON (default: gpu-results.json in the bundle root)
#   --passages N            parity: passages embedded on the CPU and on D (default 200)
#   --throughput-passages N throughput: passages per timed run (default 2000)
#   --infembed-f16          also time `infembed embed --dtype f16` on the device and record
#                           its embeddings' difference from the CPU's (informational: its
#                           failure does not fail the run); the profile and sweep stages then
#                           cover f16 too
#   --embed-runs N          timed `infembed embed` runs; the first compiles shaders (default 2)
#   --only LIST             run only these of probe,parity,torch,throughput,train,profile,
#                           sweep,routines (comma-separated; default all; setup, environment
#                           and devices always run)
#   --matmul R              the matrix-product routine of infembed's linear layers on the
#                           device in every stage (`infembed embed/train --matmul R`; default:
#                           the binary's own, `blocked_split`; names as the probe reports them)
#   --routines LIST         routines: for each routine one warm-up and one timed `infembed
#                           embed --matmul R --batch-size 128` of the throughput set (f16 too
#                           with --infembed-f16), and its embeddings of the parity set against
#                           the CPU's (default burn,blocked,blocked_split,blocked_64,blocked_128,double_unit,
#                           double_unit_min_tile,gemm,simple_cyclic_cmma,double_cyclic_cmma)
#   --batch-sizes LIST      sweep: one `infembed embed --batch-size N` run of the throughput
#                           set per N, after a warm-up run at each N (default 32,64,128,256);
#                           with the torch stage also the torch baseline at each N
#   --profile-passages N    profile: passages embedded with cubecl's kernel profiling (1000)
#   --profile-steps N       profile: training steps with cubecl's kernel profiling (10)
#   --probe-tokens N        probe: token rows of the probed matrix products (default 4096)
#   --probe-seconds N       probe: stopped after N seconds (default 240; its JSON is then lost)
#   --probe-routines LIST   probe: only these routines (default: every one the binary knows)
#   --skip-train            no training stage
#   --train-max-steps N     stop training after N optimizer steps (a short local test only)
#   --torch-device D        auto (CUDA when torch sees it, else CPU; default), cuda or cpu
#   --torch-backend B       auto (sentence-transformers when it imports; default), st or torch
#                           (torch_encode.py's own BERT in plain torch)
#   --torch-batch-size N    batch size of the torch baseline (default 32)
#   --torch-runs N          timed passes of the torch baseline, median reported (default 3)
#   --threshold X           parity threshold, max abs difference (default 1e-3)
#   --python PY             the Python to use (default: $PYTHON, else python3)
#   --keep-work             keep the temporary folder (logs, embeddings, trained model)
#   --logs FILE.tar.gz      also save every stage's logs and records (no embeddings, no model)
#
# Stages: setup (unpack the binary, widen the f16 weights), environment, devices,
# matmul_probe (cubek's matrix-product routines timed on the device; informational), parity,
# torch_parity, throughput_infembed (and throughput_infembed_f16 with --infembed-f16),
# torch_fp32, torch_fp16 (CUDA only), train, torch_train (PyTorch's training step on the same
# GPU), profile_kernels (where the device time goes, per kernel; informational), batch_sweep
# (encoding rates by batch size; informational), routine_sweep (encoding rates and agreement
# by matrix-product routine; informational), routine_train (the train stage again through the
# sweep's fastest f32 routine that agreed with the CPU, when that is not the train stage's own;
# informational). A failed stage is recorded in the JSON with
# its stderr tail and the next one runs; the exit status is 1 if any stage failed.
set -uo pipefail # no -e: each stage's failure is recorded, then the next stage runs

ORIG_PWD="$PWD"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEVICE=wgpu
OUT=""
PASSAGES=200
THR_PASSAGES=2000
EMBED_RUNS=2
INFEMBED_F16=0
ONLY="probe,parity,torch,throughput,train,profile,sweep,routines"
MATMUL=""
# the routine infembed takes without --matmul (crates/infembed-encoder/src/routine.rs)
DEFAULT_MATMUL=blocked_split
ROUTINES="burn,blocked,blocked_split,blocked_64,blocked_128,double_unit,double_unit_min_tile,gemm,simple_cyclic_cmma,double_cyclic_cmma"
BATCH_SIZES="32,64,128,256"
PROFILE_PASSAGES=1000
PROFILE_STEPS=10
PROBE_TOKENS=4096
PROBE_SECONDS=240
PROBE_ROUTINES=""
SKIP_TRAIN=0
TRAIN_MAX_STEPS=""
TORCH_DEVICE=auto
TORCH_BACKEND=auto
TORCH_BATCH=32
TORCH_RUNS=3
THRESHOLD=1e-3
TORCH_THRESHOLD=1e-4
PY="${PYTHON:-python3}"
KEEP_WORK=0
LOGS=""
MODEL=models/all-MiniLM-L6-v2
CONFIG=examples/configs/quickstart.toml
SOURCE=data/inf-ir-sample/distractors.jsonl

die() {
    echo "run_on_gpu.sh: $*" >&2
    exit 2
}
log() { echo "[gpu-check] $*" >&2; }
need_value() { [ "$2" -ge 2 ] || die "$1 needs a value"; }
is_count() { [[ "$1" =~ ^[1-9][0-9]*$ ]] || die "$2 must be a positive integer, not '$1'"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --device) need_value "$1" $# && DEVICE="$2" && shift 2 ;;
        --out) need_value "$1" $# && OUT="$2" && shift 2 ;;
        --passages) need_value "$1" $# && PASSAGES="$2" && shift 2 ;;
        --throughput-passages) need_value "$1" $# && THR_PASSAGES="$2" && shift 2 ;;
        --embed-runs) need_value "$1" $# && EMBED_RUNS="$2" && shift 2 ;;
        --skip-train) SKIP_TRAIN=1 && shift ;;
        --only) need_value "$1" $# && ONLY="$2" && shift 2 ;;
        --infembed-f16) INFEMBED_F16=1 && shift ;;
        --train-max-steps) need_value "$1" $# && TRAIN_MAX_STEPS="$2" && shift 2 ;;
        --profile-passages) need_value "$1" $# && PROFILE_PASSAGES="$2" && shift 2 ;;
        --profile-steps) need_value "$1" $# && PROFILE_STEPS="$2" && shift 2 ;;
        --probe-tokens) need_value "$1" $# && PROBE_TOKENS="$2" && shift 2 ;;
        --probe-seconds) need_value "$1" $# && PROBE_SECONDS="$2" && shift 2 ;;
        --probe-routines) need_value "$1" $# && PROBE_ROUTINES="$2" && shift 2 ;;
        --batch-sizes) need_value "$1" $# && BATCH_SIZES="$2" && shift 2 ;;
        --matmul) need_value "$1" $# && MATMUL="$2" && shift 2 ;;
        --routines) need_value "$1" $# && ROUTINES="$2" && shift 2 ;;
        --torch-device) need_value "$1" $# && TORCH_DEVICE="$2" && shift 2 ;;
        --torch-backend) need_value "$1" $# && TORCH_BACKEND="$2" && shift 2 ;;
        --torch-batch-size) need_value "$1" $# && TORCH_BATCH="$2" && shift 2 ;;
        --torch-runs) need_value "$1" $# && TORCH_RUNS="$2" && shift 2 ;;
        --threshold) need_value "$1" $# && THRESHOLD="$2" && shift 2 ;;
        --python) need_value "$1" $# && PY="$2" && shift 2 ;;
        --keep-work) KEEP_WORK=1 && shift ;;
        --logs) need_value "$1" $# && LOGS="$2" && shift 2 ;;
        -h | --help)
            awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "${BASH_SOURCE[0]}"
            exit 0
            ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
case "$DEVICE" in
    wgpu | wgpu:* | vulkan | vulkan:* | cpu | cuda | cuda:*) ;;
    *) die "--device must be wgpu, vulkan or cpu (wgpu:N, vulkan:N), not '$DEVICE'" ;;
esac
case "$TORCH_DEVICE" in auto | cuda | cpu) ;; *) die "--torch-device: auto, cuda or cpu" ;; esac
IFS=, read -r -a only_list <<<"$ONLY"
for g in "${only_list[@]}"; do
    case "$g" in probe | parity | torch | throughput | train | profile | sweep | routines) ;; *) die "--only: probe, parity, torch, throughput, train, profile, sweep, routines; not '$g'" ;; esac
done
IFS=, read -r -a routine_list <<<"$ROUTINES"
[ "${#routine_list[@]}" -gt 0 ] || die "--routines needs at least one routine"
IFS=, read -r -a probe_list <<<"$PROBE_ROUTINES"
for r in "${routine_list[@]}" ${MATMUL:+"$MATMUL"} ${probe_list[@]+"${probe_list[@]}"}; do
    [[ "$r" =~ ^[a-z0-9_]+$ ]] || die "--routines/--matmul/--probe-routines: routine names are lower-case words with _, not '$r'"
done
# `--matmul R` for infembed's runs on the device (the CPU refuses it)
[ -z "$MATMUL" ] || [ "$DEVICE" != cpu ] || die "--matmul is for GPU devices; the CPU computes its own products"
mm=()
[ -z "$MATMUL" ] || mm=(--matmul "$MATMUL")
IFS=, read -r -a batch_sizes <<<"$BATCH_SIZES"
[ "${#batch_sizes[@]}" -gt 0 ] || die "--batch-sizes needs at least one size"
for b in "${batch_sizes[@]}"; do is_count "$b" --batch-sizes; done
wants() { [[ ",$ONLY," == *",$1,"* ]]; }
case "$TORCH_BACKEND" in auto | st | torch) ;; *) die "--torch-backend: auto, st or torch" ;; esac
is_count "$PASSAGES" --passages
is_count "$THR_PASSAGES" --throughput-passages
is_count "$EMBED_RUNS" --embed-runs
is_count "$TORCH_BATCH" --torch-batch-size
is_count "$TORCH_RUNS" --torch-runs
is_count "$PROFILE_PASSAGES" --profile-passages
is_count "$PROFILE_STEPS" --profile-steps
is_count "$PROBE_TOKENS" --probe-tokens
is_count "$PROBE_SECONDS" --probe-seconds
[ -z "$TRAIN_MAX_STEPS" ] || is_count "$TRAIN_MAX_STEPS" --train-max-steps
if [ -n "$LOGS" ] && [[ "$LOGS" != /* ]]; then
    LOGS="$ORIG_PWD/$LOGS"
fi
if [ -z "$OUT" ]; then
    OUT="$ROOT/gpu-results.json"
elif [[ "$OUT" != /* ]]; then
    OUT="$ORIG_PWD/$OUT"
fi

cd "$ROOT" || die "cannot enter $ROOT"
if [ ! -f infembed.xz ] && [ ! -f infembed.gz ] && [ ! -x infembed ]; then
    die "$ROOT is not a GPU bundle (no infembed.xz): run the copy of this script inside the folder that scripts/gpu/pack.sh made"
fi
command -v "$PY" >/dev/null 2>&1 || die "no Python ($PY): the check needs Python 3"
mkdir -p "$(dirname "$OUT")" || die "cannot create the folder of $OUT"

# Files that pack.sh left to the working tree (from-tree.txt: tracked, unmodified, sent
# beside the bundle by the device tool): copied from the nearest folder above the bundle
# that holds them, then checked against their sha256.
if [ -f from-tree.txt ]; then
    while read -r _ rel; do
        [ -n "$rel" ] && [ ! -f "$rel" ] || continue
        src="" dir="$ROOT"
        while [ "$dir" != / ] && [ -z "$src" ]; do
            dir="$(dirname "$dir")"
            if [ -f "$dir/$rel" ]; then src="$dir/$rel"; fi
        done
        [ -n "$src" ] || die "$rel (from-tree.txt) is neither in the bundle nor in a folder above it: carry the bundle inside the repository's working tree, or pack with --no-tree-check"
        mkdir -p "$(dirname "$rel")" && cp -p "$src" "$rel" || die "cannot copy $src"
    done <from-tree.txt
    sha256sum --quiet -c from-tree.txt || die "files copied from the working tree differ from the packed commit's (from-tree.txt)"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")" || die "mktemp failed"
STAGES="$WORK/stages"
mkdir -p "$STAGES"
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [ "$KEEP_WORK" = 1 ]; then
        log "work folder kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

# wgpu's Vulkan loader and some drivers want a runtime folder.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    mkdir -m 700 "$WORK/xdg"
    export XDG_RUNTIME_DIR="$WORK/xdg"
fi

# The Vulkan loader (libvulkan.so.1) and GLVND's libraries (NVIDIA's Vulkan driver is
# libGLX_nvidia.so.0, which needs them) are not installed on every GPU machine that has the
# driver. A bundle made with `pack.sh --vulkan-loader` carries their
# Debian packages in gl/: unpacked into / (root only; a throwaway machine) when missing.
has_lib() { (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) | grep -q "$1"; }
LOADER_NOTE="present"
if ! has_lib 'libvulkan\.so\.1' || ! has_lib 'libGLdispatch\.so\.0'; then
    LOADER_NOTE="missing"
    if compgen -G "gl/*.deb" >/dev/null && command -v dpkg >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        for deb in gl/*.deb; do dpkg -x "$deb" / || log "could not unpack $deb"; done
        ldconfig 2>/dev/null || /sbin/ldconfig 2>/dev/null
        LOADER_NOTE="unpacked from gl/: $(cd gl && ls *.deb | paste -sd ' ' -)"
    fi
fi
# NVIDIA's container runtime may put the driver's ICD file outside the loader's search path.
NV_ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ] && [ -f "$NV_ICD" ] &&
    ! ls /usr/share/vulkan/icd.d/*nvidia* /etc/vulkan/icd.d/*nvidia* >/dev/null 2>&1; then
    export VK_DRIVER_FILES="$NV_ICD"
fi
log "Vulkan loader: $LOADER_NOTE; VK_DRIVER_FILES=${VK_DRIVER_FILES:-unset}"

# No network there: sentence-transformers must not try the Hugging Face hub.
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
export PYTHONUNBUFFERED=1

N=0
next_stage() { # sets out_file: the record file of the next stage (numbered in run order)
    N=$((N + 1))
    out_file="$(printf '%s/%02d-%s.json' "$STAGES" "$N" "$1")"
}
skip() { # skip NAME... REASON
    local reason="${*: -1}" name
    for name in "${@:1:$#-1}"; do
        next_stage "$name"
        helper stage --name "$name" --skipped="$reason" --out "$out_file"
    done
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.3f", b - a}'; }
helper() { "$PY" scripts/gpu/gpu_check.py "$@"; }

# run NAME CMD...: stdout to $WORK/NAME.out; stderr to $WORK/NAME.err and the terminal.
# Sets RC and SECS.
run() {
    local name="$1"
    shift
    local t0
    t0="$(now)"
    log "\$ $*"
    "$@" 2>&1 1>"$WORK/$name.out" | tee "$WORK/$name.err" >&2
    RC=${PIPESTATUS[0]}
    SECS="$(since "$t0")"
}

# ---------------------------------------------------------------------------------- setup
log "bundle $ROOT, device $DEVICE, work folder $WORK"
t_setup="$(now)"
setup_rc=0
: >"$WORK/setup.err"
if [ -f infembed.xz ]; then
    if command -v xz >/dev/null 2>&1; then
        xz -dc infembed.xz >infembed.tmp 2>>"$WORK/setup.err" || setup_rc=$?
    else # Python's lzma module reads .xz
        "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            infembed.xz infembed.tmp 2>>"$WORK/setup.err" || setup_rc=$?
    fi
elif [ -f infembed.gz ]; then
    "$PY" -c 'import gzip, shutil, sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        infembed.gz infembed.tmp 2>>"$WORK/setup.err" || setup_rc=$?
else
    cp infembed infembed.tmp 2>>"$WORK/setup.err" || setup_rc=$?
fi
if [ "$setup_rc" = 0 ]; then
    chmod +x infembed.tmp && mv -f infembed.tmp infembed || setup_rc=$?
fi
helper widen "$MODEL" >"$WORK/widen.json" 2>>"$WORK/setup.err" || setup_rc=$?
next_stage setup
helper stage --name setup --rc "$setup_rc" --seconds "$(since "$t_setup")" \
    --stderr "$WORK/setup.err" --json "weights=$WORK/widen.json" \
    --set "binary_bytes=$(stat -c %s infembed 2>/dev/null || echo null)" \
    --out "$out_file"
INFEMBED="$ROOT/infembed"

# ---------------------------------------------------------------------------- environment
# Facts only: nothing here fails the run.
{ command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } \
    >"$WORK/nvidia-smi.txt" 2>/dev/null || rm -f "$WORK/nvidia-smi.txt"
{ command -v vulkaninfo >/dev/null 2>&1 && vulkaninfo --summary 2>/dev/null | head -60; } \
    >"$WORK/vulkaninfo.txt" || rm -f "$WORK/vulkaninfo.txt"
# wgpu loads the Vulkan loader (libvulkan.so.1) at run time; the driver brings the ICD.
libvulkan="$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) | grep -m2 'libvulkan\.so' | tr -s ' \t' ' ' | sed 's/^ //' | paste -sd ';' -)"
"$PY" - >"$WORK/python.json" 2>/dev/null <<'EOF'
import json, platform
info = {"python": platform.python_version()}
for mod in ("numpy", "safetensors", "torch", "sentence_transformers", "transformers"):
    try:
        m = __import__(mod)
        info[mod] = getattr(m, "__version__", "?")
    except Exception as e:
        info[mod] = None
try:
    import torch
    info["cuda_available"] = torch.cuda.is_available()
    info["torch_cuda"] = torch.version.cuda
    if info["cuda_available"]:
        info["cuda_device"] = torch.cuda.get_device_name(0)
except Exception:
    info["cuda_available"] = False
print(json.dumps(info))
EOF
env_vars="{}"
env_vars="$("$PY" -c 'import json, os; print(json.dumps({k: os.environ.get(k) for k in ("XDG_RUNTIME_DIR", "CUBECL_WGPU_DEFAULT_DEVICE", "WGPU_BACKEND", "WGPU_ADAPTER_NAME", "VK_ICD_FILENAMES", "VK_DRIVER_FILES", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}))')" || true
next_stage environment
helper stage --name environment --rc 0 --text "nvidia_smi=$WORK/nvidia-smi.txt" \
    --text "vulkaninfo_summary=$WORK/vulkaninfo.txt" --json "python=$WORK/python.json" \
    --set "env=$env_vars" --set "libvulkan=${libvulkan:-null}" --set "kernel=$(uname -sr)" --set "cpus=$(nproc 2>/dev/null || echo null)" \
    --set "vulkan_loader=\"$LOADER_NOTE\"" --out "$out_file"
CUDA_OK=0
"$PY" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("cuda_available") else 1)' \
    "$WORK/python.json" 2>/dev/null && CUDA_OK=1

# -------------------------------------------------------------------------------- devices
run devices "$INFEMBED" devices
next_stage devices
helper stage --name devices --rc "$RC" --seconds "$SECS" --stderr "$WORK/devices.err" \
    --stdout "$WORK/devices.out" --text "output=$WORK/devices.out" --out "$out_file"

# ------------------------------------------------------------------------------ matmul probe
# `infembed devices --probe-matmul`: each of cubek's matrix-product routines timed on the
# device on all-MiniLM-L6-v2's products (PROBE_TOKENS rows), in f32 and f16, each checked
# against the host's f64 product, with the tensor-core configurations cubecl registered. It
# says which routine the encoder's products should take there. Informational.
stage_probe() {
    next_stage matmul_probe
    if [ "$DEVICE" = cpu ]; then
        helper stage --name matmul_probe --skipped="the CPU runs no cubecl kernels" --out "$out_file"
        return
    fi
    rm -f "$WORK/matmul-probe.json"
    # at most PROBE_SECONDS: the stages after it must keep their time on a rented machine
    local limit=()
    command -v timeout >/dev/null && limit=(timeout "$PROBE_SECONDS")
    local only=()
    [ -n "$PROBE_ROUTINES" ] && only=(--routines "$PROBE_ROUTINES")
    run matmul-probe ${limit[@]+"${limit[@]}"} "$INFEMBED" devices --probe-matmul "$DEVICE" \
        --tokens "$PROBE_TOKENS" ${only[@]+"${only[@]}"} --json "$WORK/matmul-probe.json"
    helper stage --name matmul_probe --rc "$RC" --seconds "$SECS" --stderr "$WORK/matmul-probe.err" \
        --stdout "$WORK/matmul-probe.out" --informational --set "tokens=$PROBE_TOKENS" \
        --json "probe=$WORK/matmul-probe.json" --out "$out_file"
}

# --------------------------------------------------------------------------------- parity
# The same passages on the CPU and on $DEVICE; max abs difference of the embeddings.
stage_parity() {
    next_stage parity
    helper passages --source "$SOURCE" --n "$PASSAGES" --out "$WORK/parity.jsonl" \
        >"$WORK/parity-input.json" 2>"$WORK/parity.err"
    prc=$?
    cpu_rc=1
    dev_rc=1
    cmp_rc=1
    if [ "$prc" = 0 ]; then
        run parity-cpu "$INFEMBED" embed --model "$MODEL" --input "$WORK/parity.jsonl" \
            --output "$WORK/parity-cpu.npy" --device cpu --restart
        cpu_rc=$RC
        helper embed-log "$WORK/parity-cpu.err" --wall "$SECS" >"$WORK/parity-cpu.json"
        run parity-dev "$INFEMBED" embed --model "$MODEL" --input "$WORK/parity.jsonl" \
            --output "$WORK/parity-dev.npy" --device "$DEVICE" --restart ${mm[@]+"${mm[@]}"}
        dev_rc=$RC
        helper embed-log "$WORK/parity-dev.err" --wall "$SECS" >"$WORK/parity-dev.json"
        cat "$WORK/parity-cpu.err" "$WORK/parity-dev.err" >>"$WORK/parity.err"
        if [ "$cpu_rc" = 0 ] && [ "$dev_rc" = 0 ]; then
            helper compare "$WORK/parity-cpu.npy" "$WORK/parity-dev.npy" --threshold "$THRESHOLD" \
                >"$WORK/parity-compare.json" 2>>"$WORK/parity.err"
            cmp_rc=$?
        fi
    fi
    parity_rc=0
    for r in "$prc" "$cpu_rc" "$dev_rc" "$cmp_rc"; do [ "$r" = 0 ] || parity_rc=$r; done
    helper stage --name parity --rc "$parity_rc" --stderr "$WORK/parity.err" \
        --set "passages=$PASSAGES" --set "device=\"$DEVICE\"" --set "threshold=$THRESHOLD" \
        --json "$WORK/parity-compare.json" --json "input=$WORK/parity-input.json" \
        --json "cpu_run=$WORK/parity-cpu.json" --json "device_run=$WORK/parity-dev.json" \
        --out "$out_file"
}

# --------------------------------------------------------------------------- torch_parity
# The torch baseline's embeddings of the parity passages against infembed's CPU ones: the
# baseline computes the same function (same widened weights).
stage_torch_parity() {
    next_stage torch_parity
    run torch-parity "$PY" scripts/gpu/torch_encode.py --model "$MODEL" \
        --input "$WORK/parity.jsonl" --device "$TORCH_DEVICE" --backend "$TORCH_BACKEND" --runs 1 \
        --batch-size "$TORCH_BATCH" --dump "$WORK/parity-torch.npy"
    tp_rc=$RC
    if [ "$tp_rc" = 0 ]; then
        helper compare "$WORK/parity-cpu.npy" "$WORK/parity-torch.npy" \
            --threshold "$TORCH_THRESHOLD" >"$WORK/torch-parity-compare.json" 2>>"$WORK/torch-parity.err"
        tp_rc=$?
    fi
    helper stage --name torch_parity --rc "$tp_rc" --seconds "$SECS" \
        --stderr "$WORK/torch-parity.err" --stdout "$WORK/torch-parity.out" \
        --json "run=$WORK/torch-parity.out" --json "$WORK/torch-parity-compare.json" \
        --out "$out_file"
    # backend and device at the top level of the record, for the report
    "$PY" - "$out_file" <<'EOF' 2>/dev/null
import json, sys
p = sys.argv[1]
rec = json.load(open(p))
run = rec.get("run") or {}
rec["backend"], rec["device"] = run.get("backend"), run.get("device")
json.dump(rec, open(p, "w"), indent=2)
EOF
}

# ---------------------------------------------------------------------- throughput (infembed)
helper passages --source "$SOURCE" --n "$THR_PASSAGES" --out "$WORK/throughput.jsonl" \
    >"$WORK/throughput-input.json" 2>"$WORK/throughput-input.err"
input_rc=$?

# infembed_throughput STAGE DTYPE: EMBED_RUNS timed `infembed embed` runs of the throughput set.
infembed_throughput() {
    local stage="$1" dtype="$2" rc="$input_rc" i extra=()
    [ "$dtype" = f32 ] || extra=(--informational) # low precision: reported, not judged
    next_stage "$stage"
    cp "$WORK/throughput-input.err" "$WORK/$stage.err"
    local runs_args=()
    if [ "$rc" = 0 ]; then
        for i in $(seq 1 "$EMBED_RUNS"); do
            run "$stage-$i" "$INFEMBED" embed --model "$MODEL" --input "$WORK/throughput.jsonl" \
                --output "$WORK/$stage-$i.npy" --device "$DEVICE" --dtype "$dtype" --restart \
                ${mm[@]+"${mm[@]}"}
            [ "$RC" = 0 ] || rc=$RC
            helper embed-log "$WORK/$stage-$i.err" --wall "$SECS" >"$WORK/$stage-$i.json"
            runs_args+=(--append "runs=$WORK/$stage-$i.json")
            cat "$WORK/$stage-$i.err" >>"$WORK/$stage.err"
            rm -f "$WORK/$stage-$i.npy" "$WORK/$stage-$i.ids.txt"
        done
    fi
    if [ "$dtype" != f32 ] && [ -f "$WORK/parity.jsonl" ]; then
        # how far the low-precision embeddings are from the CPU's (recorded, not judged)
        run "$stage-parity" "$INFEMBED" embed --model "$MODEL" --input "$WORK/parity.jsonl" \
            --output "$WORK/$stage-parity.npy" --device "$DEVICE" --dtype "$dtype" --restart \
            ${mm[@]+"${mm[@]}"}
        [ "$RC" = 0 ] || rc=$RC
        cat "$WORK/$stage-parity.err" >>"$WORK/$stage.err"
        if [ "$RC" = 0 ] && [ -f "$WORK/parity-cpu.npy" ]; then
            helper compare "$WORK/parity-cpu.npy" "$WORK/$stage-parity.npy" --threshold 1 \
                >"$WORK/$stage-compare.json" 2>>"$WORK/$stage.err" || rc=1
            extra+=(--json "vs_cpu=$WORK/$stage-compare.json")
        fi
    fi
    helper stage --name "$stage" --rc "$rc" --stderr "$WORK/$stage.err" \
        --set "passages=$THR_PASSAGES" --set "device=\"$DEVICE\"" --set "dtype=\"$dtype\"" \
        --json "input=$WORK/throughput-input.json" ${runs_args[@]+"${runs_args[@]}"} \
        ${extra[@]+"${extra[@]}"} --out "$out_file"
}
stage_throughput() {
    infembed_throughput throughput_infembed f32
    if [ "$INFEMBED_F16" = 1 ] && [ "$DEVICE" = cpu ]; then
        skip throughput_infembed_f16 "the CPU computes in f32 only"
    elif [ "$INFEMBED_F16" = 1 ]; then
        infembed_throughput throughput_infembed_f16 f16
    fi
}

# ------------------------------------------------------------------------- torch baselines
stage_torch() {
    local dtype
    for dtype in fp32 fp16; do
        next_stage "torch_$dtype"
        if [ "$dtype" = fp16 ] && { [ "$CUDA_OK" = 0 ] || [ "$TORCH_DEVICE" = cpu ]; }; then
            helper stage --name "torch_$dtype" --skipped="fp16 runs on CUDA only (torch sees no CUDA device or --torch-device cpu)" \
                --out "$out_file"
            continue
        fi
        run "torch-$dtype" "$PY" scripts/gpu/torch_encode.py --model "$MODEL" \
            --input "$WORK/throughput.jsonl" --device "$TORCH_DEVICE" --backend "$TORCH_BACKEND" \
            --dtype "$dtype" --batch-size "$TORCH_BATCH" --runs "$TORCH_RUNS"
        helper stage --name "torch_$dtype" --rc "$RC" --seconds "$SECS" \
            --stderr "$WORK/torch-$dtype.err" --stdout "$WORK/torch-$dtype.out" \
            --json "$WORK/torch-$dtype.out" --set "process_seconds=$SECS" --out "$out_file"
    done
}

# --------------------------------------------------------------------------------- train
# train_quickstart NAME [ARGS...]: the quickstart's config patched into $WORK/NAME.toml (its
# output in $WORK/NAME-out; --train-max-steps), trained on the device with ARGS; the training log
# parsed into $WORK/NAME-log.json and the dev metrics into $WORK/NAME-history.json. Sets TRAIN_RC
# and SECS.
train_quickstart() {
    local name="$1" patch_args=()
    shift
    [ -z "$TRAIN_MAX_STEPS" ] || patch_args=(--max-steps "$TRAIN_MAX_STEPS")
    helper patch-config "$CONFIG" --out "$WORK/$name.toml" --output-dir "$WORK/$name-out" \
        ${patch_args[@]+"${patch_args[@]}"} >"$WORK/$name-config.json" 2>"$WORK/$name-patch.err"
    TRAIN_RC=$?
    if [ "$TRAIN_RC" = 0 ]; then
        run "$name" "$INFEMBED" train --config "$WORK/$name.toml" --device "$DEVICE" \
            --progress plain "$@"
        TRAIN_RC=$RC
    else
        SECS=0
        cp "$WORK/$name-patch.err" "$WORK/$name.err"
    fi
    helper train-log "$WORK/$name.err" >"$WORK/$name-log.json" 2>/dev/null
    if [ "$TRAIN_RC" = 0 ]; then
        helper history "$WORK/$name-out/history.json" >"$WORK/$name-history.json" \
            2>>"$WORK/$name.err" || TRAIN_RC=$?
    fi
}

stage_train() {
    next_stage train
    train_quickstart train ${mm[@]+"${mm[@]}"}
    helper stage --name train --rc "$TRAIN_RC" --seconds "$SECS" --stderr "$WORK/train.err" \
        --stdout "$WORK/train.out" --tail 40 --set "device=\"$DEVICE\"" \
        --set "max_steps=${TRAIN_MAX_STEPS:-null}" --text "config=$WORK/train.toml" \
        --json "$WORK/train-log.json" --json "$WORK/train-history.json" --out "$out_file"
}

# The PyTorch training step on the same GPU: scripts/train/bench_torch.py, the quickstart's step
# (all-MiniLM-L6-v2, 4 records = 12 rows, multivariate (P, I), AdamW) in transformers + torch.
stage_torch_train() {
    next_stage torch_train
    local dev="$TORCH_DEVICE" steps=30 rc
    if [ "$dev" = auto ]; then
        if [ "$CUDA_OK" = 1 ]; then dev=cuda; else dev=cpu; fi
    fi
    [ "$dev" = cuda ] || steps=3
    run torch-train "$PY" scripts/train/bench_torch.py "$MODEL" --device "$dev" \
        --steps "$steps" --threads "$(nproc 2>/dev/null || echo 2)"
    rc=$RC
    helper torch-train-log "$WORK/torch-train.out" >"$WORK/torch-train.json" 2>/dev/null ||
        { [ "$rc" != 0 ] || rc=1; }
    helper stage --name torch_train --rc "$rc" --seconds "$SECS" --stderr "$WORK/torch-train.err" \
        --stdout "$WORK/torch-train.out" --set "device=\"$dev\"" --set "steps=$steps" \
        --json "$WORK/torch-train.json" --out "$out_file"
}

# ---------------------------------------------------------------------------- profile
# Where the device's time goes: cubecl times every kernel launch when its profiling logger is on
# (CUBECL_DEBUG_LOG names the file, CUBECL_DEBUG_OPTION=profile the level; it also logs each
# shader it compiles). One `embed` of PROFILE_PASSAGES passages and PROFILE_STEPS training
# steps (no dev evaluation: its encoding would mix in); gpu_check.py kernel-profile sums each
# log per kernel. The training steps log at the `profile-full` level: each launch's settings
# and cube count too, so the summary also sums the blocked kernel's launches by tile, operand
# layouts and blocks (`blocked_by_launch`: which products take the time), and names kernels by
# their type alone (`KernelBinop`, not `KernelBinop | AddOp`). Each launch is timed on its own,
# so the runs are slower than unprofiled ones: the shares are the figure, not the totals.
# Informational: a failure here does not fail the run.
stage_profile() {
    next_stage profile_kernels
    local rc=0 part args=()
    if [ "$DEVICE" = cpu ]; then
        helper stage --name profile_kernels --skipped="the CPU runs no cubecl kernels" --out "$out_file"
        return
    fi
    : >"$WORK/profile.err"
    helper passages --source "$SOURCE" --n "$PROFILE_PASSAGES" --out "$WORK/profile.jsonl" \
        >/dev/null 2>>"$WORK/profile.err" || rc=1
    local part dtype embeds=(embed)
    [ "$INFEMBED_F16" = 1 ] && embeds+=(embed_f16)
    if [ "$rc" = 0 ]; then
        for part in "${embeds[@]}"; do
            dtype=f32
            [ "$part" = embed ] || dtype=f16
            rm -f "$WORK/profile-$part.log"
            CUBECL_DEBUG_LOG="$WORK/profile-$part.log" CUBECL_DEBUG_OPTION=profile \
                run "profile-$part" "$INFEMBED" embed --model "$MODEL" --input "$WORK/profile.jsonl" \
                --output "$WORK/profile.npy" --device "$DEVICE" --dtype "$dtype" --restart \
                ${mm[@]+"${mm[@]}"}
            [ "$RC" = 0 ] || rc=$RC
            rm -f "$WORK/profile.npy" "$WORK/profile.ids.txt"
        done
    fi
    if helper patch-config "$CONFIG" --out "$WORK/profile-train.toml" \
        --output-dir "$WORK/profile-train-out" --max-steps "$PROFILE_STEPS" --no-dev \
        >/dev/null 2>>"$WORK/profile.err"; then
        rm -f "$WORK/profile-train.log"
        CUBECL_DEBUG_LOG="$WORK/profile-train.log" CUBECL_DEBUG_OPTION=profile-full \
            run profile-train "$INFEMBED" train --config "$WORK/profile-train.toml" \
            --device "$DEVICE" --progress plain ${mm[@]+"${mm[@]}"}
        [ "$RC" = 0 ] || rc=$RC
    else
        rc=1
    fi
    for part in "${embeds[@]}" train; do
        cat "$WORK/profile-$part.err" >>"$WORK/profile.err" 2>/dev/null
        if [ -f "$WORK/profile-$part.log" ] &&
            helper kernel-profile "$WORK/profile-$part.log" >"$WORK/profile-$part.json" \
                2>>"$WORK/profile.err"; then
            args+=(--json "$part=$WORK/profile-$part.json")
        else
            rc=1
        fi
        rm -f "$WORK/profile-$part.log" # shader sources included: large
    done
    helper stage --name profile_kernels --rc "$rc" --stderr "$WORK/profile.err" --informational \
        --set "passages=$PROFILE_PASSAGES" --set "steps=$PROFILE_STEPS" \
        ${args[@]+"${args[@]}"} --out "$out_file"
}

# ---------------------------------------------------------------------------- batch sweep
# Encoding rate by batch size: on a GPU each forward pass costs a few hundred kernel launches
# whatever its size, so larger batches spread them over more texts. For each N one warm-up
# run (new shapes compile new kernels) and one timed run of `infembed embed --batch-size N`,
# and with the torch stage the torch baseline at the same N (it times after a warm-up batch).
# Informational: a failure here does not fail the run.
stage_sweep() {
    next_stage batch_sweep
    local rc="$input_rc" n tag dtype part key args=() dtypes=(f32)
    [ "$INFEMBED_F16" = 1 ] && dtypes+=(f16)
    : >"$WORK/sweep.err"
    cat "$WORK/throughput-input.err" >>"$WORK/sweep.err"
    if [ "$rc" = 0 ]; then
        for n in "${batch_sizes[@]}"; do
            for dtype in "${dtypes[@]}"; do
                # f32 keeps the names it had before f16 joined (sweep-N, the `infembed` list)
                part="$n" key=infembed
                [ "$dtype" = f32 ] || part="$dtype-$n" key="infembed_$dtype"
                for tag in "warm-$part" "$part"; do # the warm-up, then the timed run (its SECS)
                    run "sweep-$tag" "$INFEMBED" embed --model "$MODEL" \
                        --input "$WORK/throughput.jsonl" --output "$WORK/sweep.npy" \
                        --device "$DEVICE" --batch-size "$n" --dtype "$dtype" --restart --quiet \
                        ${mm[@]+"${mm[@]}"}
                    [ "$RC" = 0 ] || rc=$RC
                    cat "$WORK/sweep-$tag.err" >>"$WORK/sweep.err"
                done
                helper embed-log "$WORK/sweep-$part.err" --wall "$SECS" --set "batch_size=$n" \
                    >"$WORK/sweep-$part.json"
                args+=(--append "$key=$WORK/sweep-$part.json")
            done
            rm -f "$WORK/sweep.npy" "$WORK/sweep.ids.txt"
            if wants torch; then
                run "sweep-torch-$n" "$PY" scripts/gpu/torch_encode.py --model "$MODEL" \
                    --input "$WORK/throughput.jsonl" --device "$TORCH_DEVICE" \
                    --backend "$TORCH_BACKEND" --dtype fp32 --batch-size "$n" --runs "$TORCH_RUNS"
                [ "$RC" = 0 ] || rc=$RC
                cat "$WORK/sweep-torch-$n.err" >>"$WORK/sweep.err"
                if [ -s "$WORK/sweep-torch-$n.out" ]; then
                    args+=(--append "torch_fp32=$WORK/sweep-torch-$n.out")
                fi
            fi
        done
    fi
    helper stage --name batch_sweep --rc "$rc" --stderr "$WORK/sweep.err" --informational \
        --set "passages=$THR_PASSAGES" --set "device=\"$DEVICE\"" \
        ${args[@]+"${args[@]}"} --out "$out_file"
}

# ------------------------------------------------------------------------- routine sweep
# Encoding rate and agreement by matrix-product routine (`infembed embed --matmul R`, which sends
# the linear layers' products to cubek's routine R): for each R and precision one warm-up and one
# timed run of the throughput set at batch size 128, then the parity set's embeddings against
# the CPU's (with the parity stage). Routines cubek declines on the device leave their products
# to burn's matmul (the run's log says so). Informational: a failure here does not fail the run.
stage_routines() {
    next_stage routine_sweep
    local rc="$input_rc" r dtype part tag args=() dtypes=(f32)
    [ "$INFEMBED_F16" = 1 ] && dtypes+=(f16)
    : >"$WORK/routines.err"
    if [ "$DEVICE" = cpu ]; then
        helper stage --name routine_sweep --skipped="the CPU runs no cubecl kernels" --out "$out_file"
        return
    fi
    if [ "$rc" = 0 ]; then
        for r in "${routine_list[@]}"; do
            for dtype in "${dtypes[@]}"; do
                part="$r-$dtype"
                for tag in "warm-$part" "$part"; do
                    run "routine-$tag" "$INFEMBED" embed --model "$MODEL" \
                        --input "$WORK/throughput.jsonl" --output "$WORK/routine.npy" \
                        --device "$DEVICE" --batch-size 128 --dtype "$dtype" --restart --quiet \
                        --matmul "$r"
                    [ "$RC" = 0 ] || rc=$RC
                    cat "$WORK/routine-$tag.err" >>"$WORK/routines.err"
                done
                local timed="$SECS" cmp=()
                if [ -f "$WORK/parity-cpu.npy" ]; then
                    run "routine-parity-$part" "$INFEMBED" embed --model "$MODEL" \
                        --input "$WORK/parity.jsonl" --output "$WORK/routine-parity.npy" \
                        --device "$DEVICE" --dtype "$dtype" --restart --quiet --matmul "$r"
                    [ "$RC" = 0 ] || rc=$RC
                    cat "$WORK/routine-parity-$part.err" >>"$WORK/routines.err"
                    if [ "$RC" = 0 ] && helper compare "$WORK/parity-cpu.npy" \
                        "$WORK/routine-parity.npy" --threshold 1 \
                        >"$WORK/routine-cmp-$part.json" 2>>"$WORK/routines.err"; then
                        cmp=(--json "vs_cpu=$WORK/routine-cmp-$part.json")
                    fi
                fi
                # a routine that the device declines leaves its products to burn's matmul and
                # says so once in the log: its rate is then burn's, not its own
                local fell_back=false
                grep -q "matmul routine $r did not run" "$WORK/routine-$part.err" && fell_back=true
                helper embed-log "$WORK/routine-$part.err" --wall "$timed" \
                    --set "routine=\"$r\"" --set "dtype=\"$dtype\"" \
                    --set "fell_back=$fell_back" ${cmp[@]+"${cmp[@]}"} \
                    >"$WORK/routine-$part.json"
                args+=(--append "runs=$WORK/routine-$part.json")
                rm -f "$WORK/routine.npy" "$WORK/routine.ids.txt" "$WORK/routine-parity.npy" \
                    "$WORK/routine-parity.ids.txt"
            done
        done
    fi
    helper stage --name routine_sweep --rc "$rc" --stderr "$WORK/routines.err" --informational \
        --set "passages=$THR_PASSAGES" --set "device=\"$DEVICE\"" --set "batch_size=128" \
        ${args[@]+"${args[@]}"} --out "$out_file"
}

# The quickstart's training again, through the routine sweep's fastest f32 routine whose
# embeddings agreed with the CPU's and none of whose products fell back to burn's matmul
# (gpu_check.py best-routine), so that one call measures a
# training step through it too. Informational; skipped when that routine is what the train stage
# already used (the binary's default, or --matmul's) or the sweep found none.
stage_routine_train() {
    next_stage routine_train
    local best
    best="$(helper best-routine "$WORK"/routine-*-f32.json 2>/dev/null)" || best=""
    if [ -z "$best" ]; then
        helper stage --name routine_train \
            --skipped="no routine of the sweep ran and agreed with the CPU" --out "$out_file"
        return
    fi
    if [ "$best" = "${MATMUL:-$DEFAULT_MATMUL}" ]; then
        helper stage --name routine_train \
            --skipped="the sweep's fastest agreeing routine ($best) is the train stage's own" \
            --out "$out_file"
        return
    fi
    train_quickstart routine-train --matmul "$best"
    helper stage --name routine_train --rc "$TRAIN_RC" --seconds "$SECS" --informational \
        --stderr "$WORK/routine-train.err" --tail 40 --set "device=\"$DEVICE\"" \
        --set "routine=\"$best\"" --json "$WORK/routine-train-log.json" \
        --json "$WORK/routine-train-history.json" --out "$out_file"
    rm -rf "$WORK/routine-train-out"
}

# ---------------------------------------------------------------------------- the stages
if wants probe; then stage_probe; else skip matmul_probe "not selected (--only)"; fi
if wants parity; then stage_parity; else skip parity "not selected (--only)"; fi
if wants parity && wants torch; then
    stage_torch_parity
else
    skip torch_parity "needs the parity and torch stages (--only)"
fi
if wants throughput; then stage_throughput; else skip throughput_infembed "not selected (--only)"; fi
if wants torch; then stage_torch; else skip torch_fp32 torch_fp16 "not selected (--only)"; fi
if [ "$SKIP_TRAIN" = 1 ]; then
    skip train torch_train "not run: --skip-train"
elif wants train; then
    stage_train
    stage_torch_train
else
    skip train torch_train "not selected (--only)"
fi
if wants profile; then stage_profile; else skip profile_kernels "not selected (--only)"; fi
if wants sweep; then stage_sweep; else skip batch_sweep "not selected (--only)"; fi
if wants routines; then stage_routines; else skip routine_sweep "not selected (--only)"; fi
if [ "$SKIP_TRAIN" = 1 ]; then
    skip routine_train "not run: --skip-train"
elif wants routines && wants train; then
    stage_routine_train
else
    skip routine_train "needs the routines and train stages (--only)"
fi

# -------------------------------------------------------------------------------- report
options="$(printf '{"device": "%s", "passages": %s, "throughput_passages": %s, "embed_runs": %s, "infembed_f16": %s, "only": "%s", "skip_train": %s, "train_max_steps": %s, "torch_device": "%s", "torch_backend": "%s", "torch_batch_size": %s, "torch_runs": %s, "threshold": %s, "torch_threshold": %s, "profile_passages": %s, "profile_steps": %s, "probe_tokens": %s, "probe_seconds": %s, "probe_routines": "%s", "batch_sizes": [%s], "matmul": "%s", "routines": "%s"}' \
    "$DEVICE" "$PASSAGES" "$THR_PASSAGES" "$EMBED_RUNS" "$([ "$INFEMBED_F16" = 1 ] && echo true || echo false)" "$ONLY" "$([ "$SKIP_TRAIN" = 1 ] && echo true || echo false)" \
    "${TRAIN_MAX_STEPS:-null}" "$TORCH_DEVICE" "$TORCH_BACKEND" "$TORCH_BATCH" "$TORCH_RUNS" "$THRESHOLD" "$TORCH_THRESHOLD" "$PROFILE_PASSAGES" "$PROFILE_STEPS" "$PROBE_TOKENS" "$PROBE_SECONDS" "${PROBE_ROUTINES:-all}" "$BATCH_SIZES" "${MATMUL:-$DEFAULT_MATMUL}" "$ROUTINES")"
helper report --stages "$STAGES" --out "$OUT" --device "$DEVICE" --options "$options"
status=$?
if [ -n "$LOGS" ]; then
    if (cd "$WORK" && find . -maxdepth 2 -type f \( -name '*.err' -o -name '*.out' \
        -o -name '*.json' -o -name '*.toml' -o -name '*.txt' \) ! -name '*.ids.txt' -print0 |
        tar czf "$LOGS" --null -T -); then
        log "logs: $LOGS"
    else
        log "could not write $LOGS"
    fi
fi
"$PY" - "$OUT" <<'EOF' || status=1
import json, sys
r = json.load(open(sys.argv[1]))
r.pop("stages", None)
print(json.dumps(r, indent=1))
EOF
if [ "$status" = 0 ]; then
    log "all stages passed; results in $OUT"
else
    log "FAILED stages: see failed_stages in $OUT"
fi
exit "$status"
