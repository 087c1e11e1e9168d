#!/usr/bin/env bash
# Lock CPU/GPU clocks for reproducible pomt latency curves, and restore them afterwards.
# See scripts/README.md. Exit codes: 0 ok, 1 a step failed (already rolled back), 2 bad usage / not root.
set -euo pipefail
shopt -s nullglob

PROG=lock_clocks.sh
CPU_DIR="${POMT_SYSFS_ROOT:-}/sys/devices/system/cpu"
STATE_HEADER="# pomt clock state v1: kind<TAB>key<TAB>value, one restore step per line, in the order applied"

DRY_RUN=0
TARGET=auto
GPU_CLOCK=""
MEM_CLOCK=""
NVP_MODE=""
STATE_FILE="${POMT_STATE_DIR:-/var/lib/pomt}/clock_state"
COMMAND=""

TARGETS=()      # targets this run acts on, in the order they are applied
GOV_FILES=()    # one scaling_governor file per cpufreq policy
TURBO_FILE=""   # intel_pstate/no_turbo or cpufreq/boost, if present
TURBO_OFF=""    # the value that turns turbo off in TURBO_FILE
UNDO=()         # restore steps recorded so far by this lock, in the order applied
LAST_OUTPUT=""  # combined output of the last command run by run()

usage() {
    cat <<EOF
Usage: $PROG [--dry-run] [--target auto|nvidia|jetson|cpu] [--gpu-clock MHZ] [--mem-clock MHZ]
             [--nvpmodel-mode N] [--state-file PATH] {lock|unlock|status}

  lock     lock clocks (NVIDIA GPU: persistence + locked clocks; Jetson: nvpmodel + jetson_clocks;
           CPU: performance governor, turbo off) and save what was there before in the state file
  unlock   restore exactly what 'lock' changed, from the state file
  status   print the current clock state and whether a pomt lock is active

  --dry-run          print the commands and writes that would be done ('+ ' lines); change nothing
  --target T         auto (default): Jetson if nvpmodel and jetson_clocks are on PATH, otherwise
                     NVIDIA GPU (if nvidia-smi lists one) plus CPU (if cpufreq is present)
  --gpu-clock MHZ    graphics clock to lock (default: highest supported for the memory clock)
  --mem-clock MHZ    memory clock to lock (default: highest supported)
  --nvpmodel-mode N  Jetson power mode (default 0, the maximum-performance mode on Jetson boards)
  --state-file PATH  default \${POMT_STATE_DIR:-/var/lib/pomt}/clock_state

Environment: POMT_SYSFS_ROOT prefixes every sysfs path; POMT_REQUIRE_ROOT=0 skips the root check.
EOF
}

die_usage() { echo "$PROG: $1 (see --help)" >&2; exit 2; }
die() { echo "$PROG: $1" >&2; exit 1; }
note() { echo "note: $1"; }
first_line() { printf '%s\n' "${1:-}" | head -n 1; }
has() { command -v "$1" >/dev/null 2>&1; }

# run CMD...: print '+ CMD', then run it unless --dry-run; its output is kept in LAST_OUTPUT.
run() {
    echo "+ $*"
    if [[ $DRY_RUN -eq 1 ]]; then return 0; fi
    local rc=0
    LAST_OUTPUT=$("$@" </dev/null 2>&1) || rc=$?
    return "$rc"
}

# write_file PATH VALUE: print the write, then do it unless --dry-run.
write_file() {
    echo "+ echo $2 > $1"
    if [[ $DRY_RUN -eq 1 ]]; then return 0; fi
    { printf '%s\n' "$2" >"$1"; } 2>/dev/null
}

# query CMD...: run a read-only command (also under --dry-run) and print its output.
query() { "$@" </dev/null 2>&1; }

parse_args() {
    while [[ $# -gt 0 ]]; do
        case $1 in
            --dry-run) DRY_RUN=1 ;;
            --target | --gpu-clock | --mem-clock | --nvpmodel-mode | --state-file)
                if [[ $# -lt 2 || -z $2 ]]; then die_usage "$1 needs a value"; fi
                case $1 in
                    --target) TARGET=$2 ;;
                    --gpu-clock) GPU_CLOCK=$2 ;;
                    --mem-clock) MEM_CLOCK=$2 ;;
                    --nvpmodel-mode) NVP_MODE=$2 ;;
                    --state-file) STATE_FILE=$2 ;;
                esac
                shift
                ;;
            -h | --help) usage; exit 0 ;;
            lock | unlock | status)
                if [[ -n $COMMAND ]]; then die_usage "give one command, not '$COMMAND' and '$1'"; fi
                COMMAND=$1
                ;;
            *) die_usage "unknown argument '$1'" ;;
        esac
        shift
    done
    if [[ -z $COMMAND ]]; then die_usage "missing command: lock, unlock or status"; fi
    case $TARGET in auto | nvidia | jetson | cpu) ;; *) die_usage "--target must be auto, nvidia, jetson or cpu" ;; esac
    if [[ -n $GPU_CLOCK && ! $GPU_CLOCK =~ ^[1-9][0-9]*$ ]]; then die_usage "--gpu-clock must be MHz, a positive integer"; fi
    if [[ -n $MEM_CLOCK && ! $MEM_CLOCK =~ ^[1-9][0-9]*$ ]]; then die_usage "--mem-clock must be MHz, a positive integer"; fi
    if [[ -n $NVP_MODE && ! $NVP_MODE =~ ^[0-9]+$ ]]; then die_usage "--nvpmodel-mode must be a non-negative integer"; fi
    return 0
}

require_root() {
    if [[ $DRY_RUN -eq 1 || ${POMT_REQUIRE_ROOT:-1} == 0 ]]; then return 0; fi
    local uid=${POMT_FAKE_UID:-$(id -u)}
    if [[ $uid != 0 ]]; then
        echo "$PROG: '$COMMAND' changes clocks and needs root: run it with sudo (or --dry-run to see the plan)" >&2
        exit 2
    fi
}

have_jetson() { has nvpmodel && has jetson_clocks; }

have_nvidia() {
    local out
    has nvidia-smi || return 1
    out=$(query nvidia-smi -L) || return 1
    [[ $out == *"GPU "* ]]
}

# Fill GOV_FILES (one per cpufreq policy; CPUs sharing a policy share the file) and TURBO_FILE.
find_cpu_files() {
    local f real seen=" "
    GOV_FILES=()
    for f in "$CPU_DIR"/cpu[0-9]*/cpufreq/scaling_governor; do
        real=$(readlink -f -- "$f" 2>/dev/null || printf '%s' "$f")
        if [[ $seen == *" $real "* ]]; then continue; fi
        seen+="$real "
        GOV_FILES+=("$f")
    done
    TURBO_FILE=""
    if [[ -f $CPU_DIR/intel_pstate/no_turbo ]]; then
        TURBO_FILE=$CPU_DIR/intel_pstate/no_turbo
        TURBO_OFF=1
    elif [[ -f $CPU_DIR/cpufreq/boost ]]; then
        TURBO_FILE=$CPU_DIR/cpufreq/boost
        TURBO_OFF=0
    fi
}

# Fill TARGETS. Jetson excludes the others (jetson_clocks already pins CPU, GPU and EMC);
# otherwise auto takes the NVIDIA GPU and the CPU, whichever exist.
resolve_targets() {
    find_cpu_files
    TARGETS=()
    case $TARGET in
        jetson) have_jetson || die "--target jetson: nvpmodel and jetson_clocks are not both on PATH"; TARGETS=(jetson) ;;
        nvidia) have_nvidia || die "--target nvidia: nvidia-smi is not on PATH or lists no GPU"; TARGETS=(nvidia) ;;
        cpu)
            if [[ ${#GOV_FILES[@]} -eq 0 ]]; then die "--target cpu: no cpufreq scaling_governor under $CPU_DIR"; fi
            TARGETS=(cpu)
            ;;
        auto)
            if have_jetson; then
                TARGETS=(jetson)
            else
                if [[ ${#GOV_FILES[@]} -gt 0 ]]; then TARGETS+=(cpu); fi
                if have_nvidia; then TARGETS+=(nvidia); fi
            fi
            ;;
    esac
}

# record KIND KEY VALUE: remember one restore step (in memory and, unless --dry-run, in the state file).
record() {
    if [[ $3 == *$'\t'* || $3 == *$'\n'* ]]; then fail_lock "cannot save value '$3' of $2 (tab or newline)"; fi
    UNDO+=("$1"$'\t'"$2"$'\t'"$3")
    if [[ $DRY_RUN -eq 0 ]]; then printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$STATE_FILE"; fi
}

# restore_persistence MODES: MODES is the comma-separated list of previous modes, one per GPU.
restore_persistence() {
    local -a modes
    local i flag
    IFS=, read -r -a modes <<<"$1"
    if [[ $(printf '%s\n' "${modes[@]}" | sort -u | wc -l) -eq 1 ]]; then
        flag=0
        if [[ ${modes[0]} == Enabled ]]; then flag=1; fi
        run nvidia-smi -pm "$flag"
        return
    fi
    for i in "${!modes[@]}"; do
        flag=0
        if [[ ${modes[i]} == Enabled ]]; then flag=1; fi
        run nvidia-smi -i "$i" -pm "$flag" || return 1
    done
}

# undo_step KIND KEY VALUE: apply one restore step; non-zero if it failed.
undo_step() {
    case $1 in
        sysfs) write_file "$2" "$3" ;;
        nvidia)
            case $2 in
                persistence) restore_persistence "$3" ;;
                gpu_clocks) run nvidia-smi -rgc ;;
                mem_clocks) run nvidia-smi -rmc ;;
                app_clocks) run nvidia-smi -rac ;;
                *) echo "$PROG: unknown nvidia step '$2' in the state file" >&2; return 1 ;;
            esac
            ;;
        # KEY is the previous power mode, VALUE the jetson_clocks store file. The mode goes first:
        # nvpmodel -m resets clocks to the mode's defaults, and the stored clocks belong to that mode.
        jetson) run nvpmodel -m "$2" && run jetson_clocks --restore "$3" ;;
        *) echo "$PROG: unknown step kind '$1' in the state file" >&2; return 1 ;;
    esac
}

# fail_lock MESSAGE: undo every step this lock applied, newest first, then exit 1 with one line on stderr.
fail_lock() {
    trap - INT TERM
    local i kind key value ok=1
    for ((i = ${#UNDO[@]} - 1; i >= 0; i--)); do
        IFS=$'\t' read -r kind key value <<<"${UNDO[i]}"
        undo_step "$kind" "$key" "$value" || ok=0
    done
    if [[ $ok -eq 1 ]]; then
        if [[ $DRY_RUN -eq 0 ]]; then rm -f -- "$STATE_FILE"; fi
        echo "$PROG: $1; rolled back, nothing changed" >&2
    else
        echo "$PROG: $1; rollback incomplete, run '$PROG unlock' to retry (state in $STATE_FILE)" >&2
    fi
    exit 1
}

# set_sysfs PATH VALUE: save the old value of PATH, then write VALUE (skipped when it is already VALUE).
set_sysfs() {
    local old
    old=$(cat -- "$1" 2>/dev/null) || fail_lock "cannot read $1"
    if [[ $old == "$2" ]]; then return 0; fi
    record sysfs "$1" "$old"
    write_file "$1" "$2" || fail_lock "cannot write '$2' to $1"
}

lock_cpu() {
    local f
    for f in "${GOV_FILES[@]}"; do set_sysfs "$f" performance; done
    if [[ -n $TURBO_FILE ]]; then
        set_sysfs "$TURBO_FILE" "$TURBO_OFF"
    else
        note "no intel_pstate/no_turbo or cpufreq/boost under $CPU_DIR; turbo left as it is"
    fi
}

# Queries done before anything changes: previous persistence modes and the clock pair to lock.
preflight_nvidia() {
    local out
    out=$(query nvidia-smi --query-gpu=persistence_mode --format=csv,noheader) ||
        die "cannot query persistence mode: $(first_line "$out")"
    NV_PREV_PM=$(printf '%s\n' "$out" | tr -d ' \r' | awk 'NF' | paste -sd, -)
    if [[ ! $NV_PREV_PM =~ ^(Enabled|Disabled)(,(Enabled|Disabled))*$ ]]; then
        die "unexpected persistence mode from nvidia-smi: $(first_line "$out")"
    fi
    NV_MEM=$MEM_CLOCK
    NV_GFX=$GPU_CLOCK
    if [[ -n $NV_MEM && -n $NV_GFX ]]; then return 0; fi
    out=$(query nvidia-smi --query-supported-clocks=memory,graphics --format=csv,noheader,nounits) ||
        die "cannot query supported clocks ($(first_line "$out")); pass --gpu-clock and --mem-clock"
    if [[ -z $NV_MEM ]]; then
        NV_MEM=$(awk -F', *' '$1 ~ /^[0-9]+$/ && $1 + 0 > m { m = $1 + 0 } END { if (m) print m }' <<<"$out")
    fi
    if [[ -z $NV_GFX ]]; then
        NV_GFX=$(awk -F', *' -v mem="$NV_MEM" '$1 + 0 == mem + 0 && $2 ~ /^[0-9]+$/ && $2 + 0 > g { g = $2 + 0 }
            END { if (g) print g }' <<<"$out")
    fi
    if [[ -z $NV_MEM || -z $NV_GFX ]]; then
        die "no supported graphics clock for memory clock '${NV_MEM:-?}' in nvidia-smi's list; pass --gpu-clock and --mem-clock"
    fi
}

lock_nvidia() {
    record nvidia persistence "$NV_PREV_PM"
    run nvidia-smi -pm 1 || fail_lock "nvidia-smi -pm 1 failed: $(first_line "$LAST_OUTPUT")"
    if run nvidia-smi -lgc "$NV_GFX,$NV_GFX"; then
        if run nvidia-smi -lmc "$NV_MEM,$NV_MEM"; then
            record nvidia gpu_clocks locked
            record nvidia mem_clocks locked
            return 0
        fi
        note "nvidia-smi -lmc not supported ($(first_line "$LAST_OUTPUT")); using application clocks instead"
        if ! run nvidia-smi -rgc; then
            record nvidia gpu_clocks locked
            fail_lock "nvidia-smi -rgc failed: $(first_line "$LAST_OUTPUT")"
        fi
    else
        note "nvidia-smi -lgc not supported ($(first_line "$LAST_OUTPUT")); using application clocks instead"
    fi
    run nvidia-smi -ac "$NV_MEM,$NV_GFX" ||
        fail_lock "cannot lock GPU clocks: -lgc/-lmc and -ac $NV_MEM,$NV_GFX failed: $(first_line "$LAST_OUTPUT")"
    record nvidia app_clocks set
}

preflight_jetson() {
    local out
    out=$(query nvpmodel -q) || die "nvpmodel -q failed: $(first_line "$out")"
    JETSON_PREV_MODE=$(awk '/^[[:space:]]*[0-9]+[[:space:]]*$/ { m = $1 } END { print m }' <<<"$out")
    if [[ -z $JETSON_PREV_MODE ]]; then die "cannot read the current power mode from 'nvpmodel -q'"; fi
    JETSON_MODE=${NVP_MODE:-0}
    JETSON_STORE="$STATE_FILE.jetson"
}

lock_jetson() {
    run jetson_clocks --store "$JETSON_STORE" ||
        fail_lock "jetson_clocks --store failed: $(first_line "$LAST_OUTPUT")"
    record jetson "$JETSON_PREV_MODE" "$JETSON_STORE"
    run nvpmodel -m "$JETSON_MODE" || fail_lock "nvpmodel -m $JETSON_MODE failed: $(first_line "$LAST_OUTPUT")"
    run jetson_clocks || fail_lock "jetson_clocks failed: $(first_line "$LAST_OUTPUT")"
}

cmd_lock() {
    require_root
    resolve_targets
    if [[ ${#TARGETS[@]} -eq 0 ]]; then
        die "nothing to lock: no nvpmodel+jetson_clocks, no GPU from nvidia-smi, no cpufreq under $CPU_DIR"
    fi
    if [[ -e $STATE_FILE ]]; then
        die "a pomt lock is already active (state in $STATE_FILE); run '$PROG unlock' first"
    fi
    local t
    for t in "${TARGETS[@]}"; do
        case $t in
            nvidia) preflight_nvidia ;;
            jetson) preflight_jetson ;;
        esac
    done
    if [[ $DRY_RUN -eq 0 ]]; then
        if ! { mkdir -p -- "$(dirname -- "$STATE_FILE")" && printf '%s\n' "$STATE_HEADER" >"$STATE_FILE"; } 2>/dev/null; then
            die "cannot write the state file $STATE_FILE (set --state-file or POMT_STATE_DIR)"
        fi
    fi
    trap 'fail_lock "interrupted"' INT TERM
    for t in "${TARGETS[@]}"; do "lock_$t"; done
    trap - INT TERM
    if [[ $DRY_RUN -eq 1 ]]; then
        echo "dry run: would lock ${TARGETS[*]}; nothing changed"
    else
        echo "locked: ${TARGETS[*]} (state in $STATE_FILE; restore with '$PROG unlock')"
    fi
}

cmd_unlock() {
    require_root
    if [[ ! -f $STATE_FILE ]]; then
        echo "no pomt lock active ($STATE_FILE not found); nothing to restore"
        return 0
    fi
    local -a steps=() failed=()
    local line i kind key value
    while IFS= read -r line || [[ -n $line ]]; do
        if [[ -z $line || $line == \#* ]]; then continue; fi
        steps+=("$line")
    done <"$STATE_FILE"
    for ((i = ${#steps[@]} - 1; i >= 0; i--)); do
        IFS=$'\t' read -r kind key value <<<"${steps[i]}"
        if ! undo_step "$kind" "$key" "$value"; then
            failed=("${steps[i]}" "${failed[@]}")
        elif [[ $kind == jetson && $DRY_RUN -eq 0 ]]; then
            rm -f -- "$value"
        fi
    done
    if [[ $DRY_RUN -eq 1 ]]; then
        echo "dry run: would restore ${#steps[@]} step(s) from $STATE_FILE; nothing changed"
        return 0
    fi
    if [[ ${#failed[@]} -eq 0 ]]; then
        rm -f -- "$STATE_FILE"
        echo "restored ${#steps[@]} step(s); pomt lock removed"
        return 0
    fi
    { printf '%s\n' "$STATE_HEADER"; printf '%s\n' "${failed[@]}"; } >"$STATE_FILE"
    echo "$PROG: ${#failed[@]} of ${#steps[@]} restore step(s) failed (first: $(first_line "${failed[0]}" | tr '\t' ' ')); they stay in $STATE_FILE, fix and re-run unlock" >&2
    exit 1
}

status_cpu() {
    local f summary turbo_val
    if [[ ${#GOV_FILES[@]} -eq 0 ]]; then
        echo "cpu governor: unknown (no cpufreq under $CPU_DIR)"
    else
        summary=$(for f in "${GOV_FILES[@]}"; do cat -- "$f" 2>/dev/null || echo unreadable; done |
            sort | uniq -c | awk '{ printf "%s%s x%s", sep, $2, $1; sep = ", " }')
        echo "cpu governor: $summary"
    fi
    if [[ -z $TURBO_FILE ]]; then
        echo "cpu turbo: unknown (no intel_pstate/no_turbo or cpufreq/boost)"
    else
        turbo_val=$(cat -- "$TURBO_FILE" 2>/dev/null || echo "?")
        if [[ $turbo_val == "$TURBO_OFF" ]]; then
            echo "cpu turbo: off (${TURBO_FILE#"$CPU_DIR"/}=$turbo_val)"
        else
            echo "cpu turbo: on (${TURBO_FILE#"$CPU_DIR"/}=$turbo_val)"
        fi
    fi
}

cmd_status() {
    resolve_targets_for_status
    local out t
    for t in "${TARGETS[@]}"; do
        case $t in
            cpu) status_cpu ;;
            nvidia)
                echo "gpu clocks (nvidia-smi):"
                out=$(query nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,persistence_mode \
                    --format=csv) || out="query failed: $(first_line "$out")"
                printf '  %s\n' "$out"
                ;;
            jetson)
                echo "jetson power mode (nvpmodel -q):"
                out=$(query nvpmodel -q) || out="query failed: $(first_line "$out")"
                printf '  %s\n' "$out"
                echo "jetson clocks (jetson_clocks --show):"
                out=$(query jetson_clocks --show) || out="query failed: $(first_line "$out")"
                printf '  %s\n' "$out"
                ;;
        esac
    done
    if [[ -f $STATE_FILE ]]; then
        echo "pomt lock: active ($(grep -vc '^#' "$STATE_FILE" || true) restore step(s) in $STATE_FILE)"
    else
        echo "pomt lock: none ($STATE_FILE not found)"
    fi
}

# Status shows every clock domain found (the CPU always, as 'unknown' when cpufreq is missing).
resolve_targets_for_status() {
    find_cpu_files
    TARGETS=()
    case $TARGET in
        auto)
            TARGETS=(cpu)
            if have_nvidia; then TARGETS+=(nvidia); fi
            if have_jetson; then TARGETS+=(jetson); fi
            ;;
        *) TARGETS=("$TARGET") ;;
    esac
}

main() {
    parse_args "$@"
    case $COMMAND in
        lock) cmd_lock ;;
        unlock) cmd_unlock ;;
        status) cmd_status ;;
    esac
}

main "$@"
