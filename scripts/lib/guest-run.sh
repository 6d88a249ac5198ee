# shellcheck shell=bash
# The skeleton the comparison scripts share (compare, compare-wire, compare-rate, compare-many,
# count-instructions, demo-cmatose): each checks its knobs, installs the guest tooling
# (`softroce --install-only`) and its own extra packages, builds its examples on the host, then
# runs itself again inside the guest, where it starts servers and clients and waits for each
# server to listen. Sourced from the repository's root, after the script has set
# `script_name` (the prefix of its messages):
#
#   script_name=compare
#   # shellcheck source=scripts/lib/guest-run.sh
#   source scripts/lib/guest-run.sh

# shellcheck source=scripts/lib/packages.sh
source scripts/lib/packages.sh

# usage_error MESSAGE...: says what is wrong with a knob or an argument and exits with 2.
usage_error() {
    echo "$script_name: $*" >&2
    exit 2
}

# ensure_packages PKG...: apt-installs those of the Debian packages not installed yet.
ensure_packages() {
    local pkg missing=()
    for pkg in "$@"; do
        package_installed "$pkg" || missing+=("$pkg")
    done
    ((${#missing[@]})) || return 0
    echo "$script_name: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=900 update -qq >&2
    apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# build_examples [--hooks] PROFILE EXAMPLE...: builds those examples of rdma-async-examples in
# PROFILE (release or debug), cargo's output on stderr.
#
# A release build is what is measured, built as a user's build gets the library: without the
# test hooks that .cargo/config.toml switches on (`--cfg rdma_async_hooks`, which add a few
# branches and counters to the data path; a RUSTFLAGS variable, even an empty one, replaces the
# config's flags, and the examples use no hooks). A debug build only checks the script: it keeps
# the config's flags, and so the debug builds of the tests. --hooks keeps the config's flags in
# a release build too (a demo, which measures nothing).
build_examples() {
    local hooks=0
    [[ $1 == --hooks ]] && { hooks=1; shift; }
    local profile=$1 build=() cargo_env=() example examples=()
    shift
    case $profile in
        release)
            build=(--release)
            ((hooks)) || cargo_env=(env "RUSTFLAGS=${RUSTFLAGS-}")
            ;;
        debug) ;;
        *) usage_error "build_examples: the profile is release or debug, not '$profile'" ;;
    esac
    for example in "$@"; do examples+=(--example "$example"); done
    "${cargo_env[@]}" cargo build "${build[@]}" --locked -p rdma-async-examples "${examples[@]}" >&2
}

# boot_with_idle_poll: the guest that rerun_in_guest boots gets idle=poll, unless COMPARE_APPEND
# says otherwise (COMPARE_APPEND="" boots without it). idle=poll: idle guest CPUs spin instead
# of halting. Waking a halted vCPU under TCG costs tens of microseconds at random, which made
# single runs swing by 2x; with it the rounds of a cell agree within a few percent.
boot_with_idle_poll() {
    export SOFTROCE_APPEND="${COMPARE_APPEND-idle=poll}"
}

# rerun_in_guest ARG...: runs this script again where RDMA works (scripts/softroce: a Soft-RoCE
# guest, or this machine if it has a device), as `SCRIPT --in-guest ARG...`.
rerun_in_guest() {
    scripts/softroce "$0" --in-guest "$@"
}

# rerun_on_pair ARG...: runs this script again on node 1 of a two-node boot (scripts/softroce
# --pair), as `SCRIPT --on-node1 ARG...`.
rerun_on_pair() {
    scripts/softroce --pair "$0" --on-node1 "$@"
}

# wait_listening [--tcp] PORT [TRIES [SECONDS]]: waits until an rdma_cm id listens on PORT (with
# --tcp, or a TCP socket), checking TRIES times (default 400) SECONDS apart (default 0.025);
# returns 1 with a message if nothing did. Self-contained (no other function, only
# script_name), so `declare -f wait_listening` can carry it to a command run elsewhere.
wait_listening() {
    local tcp=0
    [[ $1 == --tcp ]] && { tcp=1; shift; }
    local port=$1 tries=${2:-400} interval=${3:-0.025}
    for _ in $(seq "$tries"); do
        rdma resource show cm_id | grep -q "state LISTEN .*src-addr [^ ]*:$port " && return 0
        ((tcp)) && ss -ltn 2>/dev/null | grep -q ":$port " && return 0
        sleep "$interval"
    done
    echo "$script_name: nothing listens on port $port" >&2
    return 1
}

# c_polling_off DIR [US]: C rsockets' busy-polling off (/etc/rdma/rsocket/polling_time = 0),
# or a window of US microseconds, until the script exits, when the setting is put back (a copy
# is kept in DIR). The guest sees the host's /etc (read-only): the setting is written here,
# before the guest boots.
c_polling_off() {
    local dir=$1 us=${2:-0} conf=/etc/rdma/rsocket/polling_time
    if [[ -e $conf ]]; then
        cp -p -- "$conf" "$dir/polling_time.saved"
        # shellcheck disable=SC2064 # the paths are fixed now
        trap "cp -p -- '$dir/polling_time.saved' '$conf'" EXIT
    else
        trap "rm -f -- '$conf'" EXIT
    fi
    mkdir -p -- "$(dirname -- "$conf")"
    echo "$us" >"$conf"
}
