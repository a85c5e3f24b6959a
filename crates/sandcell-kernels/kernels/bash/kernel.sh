# Sandcell bash kernel: one persistent shell speaking PROTOCOL.md.
#
# Started as `bash --noprofile --norc -c <this file> sandcell-kernel`. The driver loop below
# reads one JSON request per line from the control pipe and writes JSON events to the event
# pipe. Cells are run in this very shell, so cwd, variables (also `declare`d ones), exports,
# functions, options, traps and aliases (if `shopt -s expand_aliases`) persist.
#
# How a cell runs: its source is piped into `. /dev/fd/62` (the `.` runs in this shell because
# of `lastpipe`), at the top level of the driver, so `declare` makes globals, `return` ends the
# cell and `local` is an error, as in a script. Error messages name the cell `/dev/fd/62`.
# Output goes straight to fds 1 and 2 (no stream events); `done` carries `exit_code`.
#
# The driver's own names start with `__sc_` (functions are read-only). The two protocol pipes
# sit on high descriptors (250/251 when possible) and are closed while a cell runs, so user
# commands and their children do not inherit them.
#
# What user code can do to the driver:
# - `exit`, `exec cmd`, `set -u` plus an unset variable, `${x:?}` and other fatal expansion
#   errors end the shell: the agent reports a crash (state lost).
# - `set -e` works per cell without ending the shell: a failing command stops the cell
#   (status `error`, its exit code). This uses an ERR trap with `set -E` while cells run
#   (so `$-` shows E); a user ERR trap replaces it, and then `set -e` ends the shell again.
# - Interrupts (SIGINT): the driver's INT trap stops the cell between two commands (it
#   unwinds functions and the cell with `extdebug` and a DEBUG trap that returns 2), and done
#   says `interrupted` (exit_code 130). A foreground child only stops if it gets the signal
#   too (the agent signals the kernel's process group; bash runs traps only once the child
#   it waits for has ended). A user INT trap lasts until the end of its cell.
# - A user DEBUG trap keeps working in cells (it is lifted while the driver runs).
# - `set -n` stops everything, including the driver (the agent's grace period kills it).

if [[ -z ${SANDCELL_KERNEL_CTL_FD-} || -z ${SANDCELL_KERNEL_EVENT_FD-} ]]; then
    builtin printf 'sandcell-kernel: SANDCELL_KERNEL_CTL_FD and SANDCELL_KERNEL_EVENT_FD must be set\n' >&2
    exit 2
fi
exec {__sc_t1}<&"$SANDCELL_KERNEL_CTL_FD" {__sc_t2}>&"$SANDCELL_KERNEL_EVENT_FD" || exit 2
exec {SANDCELL_KERNEL_CTL_FD}<&- {SANDCELL_KERNEL_EVENT_FD}>&-
if { exec 250<&"$__sc_t1" 251>&"$__sc_t2"; } 2>/dev/null; then
    exec {__sc_t1}<&- {__sc_t2}>&-
    declare -r __sc_ctl=250 __sc_ev=251
else
    declare -r __sc_ctl=$__sc_t1 __sc_ev=$__sc_t2
fi
unset SANDCELL_KERNEL_CTL_FD SANDCELL_KERNEL_EVENT_FD __sc_t1 __sc_t2

__sc_count=0          # executions so far
__sc_last=0           # exit status of the last cell (restored as $? for the next one)
__sc_flags=           # the user's `set` flags (letters) between cells
__sc_pipefail=0       # the user's pipefail, lastpipe and extdebug between cells
__sc_lastpipe=0
__sc_extdebug=0
__sc_utraps=          # the user's DEBUG and ERR traps between cells (`trap -p` text)
__sc_ourerr=1         # 1: the ERR trap while a cell runs is the driver's (errexit emulation)
__sc_intr=0           # set by the INT trap
__sc_errexit=0        # set when the ERR trap stopped a cell under `set -e`
__sc_errst=0
__sc_udebug=          # the user's DEBUG trap, saved when an unwind replaces it

# --- JSON --------------------------------------------------------------------------------

# __sc_jstr STRING: sets __sc_r to STRING as a JSON string literal (quotes included).
__sc_jstr() {
    local LC_ALL=C s=$1 c i
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\t'/\\t}
    s=${s//$'\r'/\\r}
    for ((i = 1; i < 32; i++)); do
        builtin printf -v c "\\x$(( i / 16 ))$(builtin printf %x $(( i % 16 )))"
        [[ $s == *"$c"* ]] && s=${s//"$c"/$(builtin printf '\\u%04x' "$i")}
    done
    __sc_r="\"$s\""
}

# __sc_restore PIECE: sets __sc_r to PIECE with the parse placeholders put back
# (\x1e: an escaped backslash, \x1f: an escaped quote).
__sc_restore() {
    local s=$1
    s=${s//$'\x1f'/\"}
    __sc_r=${s//$'\x1e'/\\}
}

# __sc_unescape CONTENTS: sets __sc_r to the decoded JSON string CONTENTS (between the
# quotes, with \\ and \" already replaced by the placeholders of __sc_restore).
__sc_unescape() {
    local LC_ALL=C s=$1
    if [[ $s != *\\* ]]; then
        __sc_restore "$s"
        return
    fi
    s=${s//\\n/$'\n'}
    s=${s//\\t/$'\t'}
    s=${s//\\\//\/}
    s=${s//\\r/$'\r'}
    s=${s//\\b/$'\b'}
    s=${s//\\f/$'\f'}
    if [[ $s != *\\* ]]; then
        __sc_restore "$s"
        return
    fi
    # Only \uXXXX escapes are left: split at the backslashes.
    local -a parts out
    local IFS='\' p cp lo f i n
    local -
    builtin set -f
    parts=($s)
    IFS=
    __sc_restore "${parts[0]}"
    out=("$__sc_r")
    n=${#parts[@]}
    for ((i = 1; i < n; i++)); do
        p=${parts[i]}
        if [[ $p != u[0-9a-fA-F][0-9a-fA-F][0-9a-fA-F][0-9a-fA-F]* ]]; then
            __sc_restore "\\$p" # not valid JSON; keep it as it was
            out+=("$__sc_r")
            continue
        fi
        cp=$(( 16#${p:1:4} ))
        p=${p:5}
        if (( cp >= 0xD800 && cp < 0xDC00 && i + 1 < n )) && [[ -z $p ]] \
            && [[ ${parts[i+1]} == u[dD][c-fC-F][0-9a-fA-F][0-9a-fA-F]* ]]; then
            lo=$(( 16#${parts[i+1]:1:4} ))
            cp=$(( 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00) ))
            i=$(( i + 1 ))
            p=${parts[i]:5}
        fi
        if (( cp >= 0xD800 && cp < 0xE000 )); then
            cp=0xFFFD # a lone surrogate
        fi
        if (( cp < 0x80 )); then
            builtin printf -v f '\\x%02x' "$cp"
        elif (( cp < 0x800 )); then
            builtin printf -v f '\\x%02x\\x%02x' $(( 0xC0 | cp >> 6 )) $(( 0x80 | (cp & 0x3F) ))
        elif (( cp < 0x10000 )); then
            builtin printf -v f '\\x%02x\\x%02x\\x%02x' $(( 0xE0 | cp >> 12 )) \
                $(( 0x80 | ((cp >> 6) & 0x3F) )) $(( 0x80 | (cp & 0x3F) ))
        else
            builtin printf -v f '\\x%02x\\x%02x\\x%02x\\x%02x' $(( 0xF0 | cp >> 18 )) \
                $(( 0x80 | ((cp >> 12) & 0x3F) )) $(( 0x80 | ((cp >> 6) & 0x3F) )) \
                $(( 0x80 | (cp & 0x3F) ))
        fi
        builtin printf -v f "$f"
        __sc_restore "$p"
        out+=("$f" "$__sc_r")
    done
    __sc_r="${out[*]}"
}

# __sc_parse LINE: reads the top-level members op, id and code of a request into __sc_op,
# __sc_id (the number as sent) and __sc_code (decoded). Returns 1 if LINE is not an object.
__sc_parse() {
    local LC_ALL=C s=$1 tok key= colon=0 depth=0 lit i j n c
    local -a t
    __sc_op= __sc_id= __sc_code=
    # Every backslash in JSON text is inside a string: hide the escaped backslashes and
    # quotes, so that each remaining `"` starts or ends a string, and split at them: even
    # tokens are structure, odd ones string contents.
    s=${s//\\\\/$'\x1e'}
    s=${s//\\\"/$'\x1f'}
    {
        local IFS='"'
        local -
        builtin set -f
        t=($s)
    }
    n=${#t[@]}
    for ((i = 0; i < n; i++)); do
        tok=${t[i]}
        if (( i % 2 == 1 )); then
            if (( depth == 1 )); then
                if (( colon )); then
                    case $key in
                        op) __sc_op=$tok ;;
                        code) __sc_unescape "$tok"; __sc_code=$__sc_r ;;
                    esac
                else
                    key=$tok
                fi
            fi
            continue
        fi
        lit=
        for ((j = 0; j < ${#tok}; j++)); do
            c=${tok:j:1}
            case $c in
                '{' | '[') depth=$(( depth + 1 )) ;;
                '}' | ']') depth=$(( depth - 1 )) ;;
                :) (( depth == 1 )) && colon=1 ;;
                ,)
                    if (( depth == 1 )); then
                        [[ $key == id && -n $lit ]] && __sc_id=$lit
                        colon=0 lit=
                    fi
                    ;;
                [[:space:]]) ;;
                *) (( depth == 1 && colon )) && lit+=$c ;;
            esac
        done
        [[ $key == id && -n $lit ]] && __sc_id=$lit
    done
    [[ ${t[0]} == *'{'* ]]
}

# --- events ------------------------------------------------------------------------------

__sc_send() {
    builtin printf '%s\n' "$1" >&"$__sc_ev"
}

__sc_reply_error() {
    __sc_jstr "$1"
    __sc_send "{\"type\":\"reply\",\"id\":${__sc_id:-null},\"error\":$__sc_r}"
}

# --- is_complete -------------------------------------------------------------------------

__sc_is_complete() {
    local out status=complete code=$1 tail
    out=$(
        exec {__sc_ctl}<&- {__sc_ev}>&-
        builtin printf '%s\n' "$code" | LC_ALL=C "$BASH" --noprofile --norc -n 2>&1 >/dev/null
    )
    if [[ $out == *'unexpected end of file'* || $out == *'unexpected EOF'* \
        || $out == *'delimited by end-of-file'* ]]; then
        status=incomplete
    elif [[ $out == *'syntax error'* ]]; then
        status=invalid
    else
        # A line ending in an unescaped backslash continues on the next one.
        tail=${code%$'\n'}
        tail=${tail##*[!\\]}
        (( ${#tail} % 2 == 1 )) && status=incomplete
    fi
    __sc_send "{\"type\":\"reply\",\"id\":$__sc_id,\"status\":\"$status\"}"
}

# --- running cells -----------------------------------------------------------------------

# The INT trap while a cell runs: start unwinding.
__sc_on_int() {
    __sc_intr=1
    __sc_unwind_start
}

# The ERR trap while a cell runs: under `set -e`, stop the cell instead of the shell.
__sc_on_err() {
    local __sc_s=$?
    [[ $- == *e* ]] || return "$__sc_s"
    # In a subshell, do what errexit does there.
    [[ $BASHPID == "$$" ]] || exit "$__sc_s"
    builtin set +e
    __sc_errexit=1 __sc_errst=$__sc_s
    __sc_unwind_start
}

__sc_unwind_start() {
    if [[ -z $__sc_udebug ]]; then
        __sc_udebug=$(builtin trap -p DEBUG)
        __sc_udebug=${__sc_udebug:-none}
    fi
    builtin shopt -s extdebug
    builtin trap '__sc_unwind' DEBUG
}

# With extdebug, a DEBUG trap that returns 2 makes the function or sourced file it runs in
# return: every command of the cell, at every depth, returns until the cell's `.` is done.
__sc_unwind() {
    [[ " ${FUNCNAME[*]:1} " == *" source "* ]] && return 2
    return 0
}

# Runs right before the cell's `.`: puts back the user's options and traps.
__sc_enter() {
    builtin trap '__sc_on_int' INT
    builtin shopt -u lastpipe
    (( __sc_lastpipe )) && builtin shopt -s lastpipe
    (( __sc_extdebug )) && builtin shopt -s extdebug
    (( __sc_pipefail )) && builtin set -o pipefail
    [[ -n $__sc_utraps ]] && builtin eval "$__sc_utraps"
    if (( __sc_ourerr )); then
        builtin trap '__sc_on_err' ERR
        builtin set -E
    fi
    local f=${__sc_flags//[!aCeEfkTub]/}
    [[ -n $f ]] && builtin set "-$f"
    # $? for the cell is the previous cell's status (unless that would trip an ERR trap).
    if [[ $f != *e* ]] && (( __sc_ourerr )); then
        return "$__sc_last"
    fi
    return 0
}

# --- start -------------------------------------------------------------------------------

builtin readonly -f __sc_jstr __sc_restore __sc_unescape __sc_parse __sc_send \
    __sc_reply_error __sc_is_complete __sc_on_int __sc_on_err __sc_unwind_start __sc_unwind \
    __sc_enter
builtin trap '' INT
__sc_jstr "$BASH_VERSION"
__sc_send "{\"type\":\"ready\",\"language\":\"bash\",\"version\":$__sc_r,\"pid\":$$}"

while IFS= builtin read -r -u "$__sc_ctl" __sc_line || [[ -n $__sc_line ]]; do
    if ! __sc_parse "$__sc_line"; then
        __sc_id=
        __sc_reply_error "invalid request: not a JSON object"
        continue
    fi
    if [[ ! $__sc_id =~ ^-?[0-9]+$ ]]; then
        __sc_id=
        __sc_reply_error "invalid request: no integer id"
        continue
    fi
    case $__sc_op in
        execute)
            __sc_count=$(( __sc_count + 1 ))
            __sc_intr=0 __sc_errexit=0 __sc_udebug=
            # Options the user wants for the cell that would show (-x, -v) or trace the
            # driver are set by a prefix on the cell's first line.
            __sc_pre=${__sc_flags//[!xv]/}
            [[ -n $__sc_pre ]] && __sc_code="builtin set -$__sc_pre;$__sc_code"
            builtin shopt -s lastpipe
            {
                builtin printf '%s' "$__sc_code" | { __sc_enter; . /dev/fd/62; } 62<&0 0<&61
            } 61<&0 {__sc_ctl}<&- {__sc_ev}>&-
            # Back in the driver: save the user's state, then make the shell safe for it.
            __sc_st=$? __sc_utraps=$(builtin trap -p DEBUG ERR)
            builtin trap '' INT
            builtin trap - DEBUG ERR
            __sc_flags=$-
            builtin set +aCeEfkTuvxb
            __sc_pipefail=0 __sc_lastpipe=0 __sc_extdebug=0
            [[ -o pipefail ]] && __sc_pipefail=1
            builtin set +o pipefail
            builtin shopt -q lastpipe && __sc_lastpipe=1
            if [[ -n $__sc_udebug ]]; then
                # An unwind replaced the DEBUG trap and turned extdebug on.
                __sc_utraps=${__sc_utraps//"trap -- '__sc_unwind' DEBUG"/}
                [[ $__sc_udebug != none ]] && __sc_utraps+=$'\n'$__sc_udebug
            else
                builtin shopt -q extdebug && __sc_extdebug=1
            fi
            builtin shopt -u extdebug
            if [[ $__sc_utraps == *"trap -- '__sc_on_err' ERR"* ]]; then
                __sc_ourerr=1
                __sc_utraps=${__sc_utraps//"trap -- '__sc_on_err' ERR"/}
                __sc_flags=${__sc_flags//E/}
            else
                __sc_ourerr=0
            fi
            (( __sc_errexit )) && __sc_flags+=e
            [[ -z ${__sc_utraps//[[:space:]]/} ]] && __sc_utraps=
            if (( __sc_intr )); then
                __sc_last=130
                __sc_status=interrupted
                __sc_send "{\"type\":\"error\",\"id\":$__sc_id,\"ename\":\"Interrupted\",\"evalue\":\"interrupted by SIGINT\",\"traceback\":[]}"
            else
                (( __sc_errexit )) && __sc_st=$__sc_errst
                __sc_last=$__sc_st
                __sc_status=ok
                (( __sc_st == 0 )) || __sc_status=error
            fi
            __sc_send "{\"type\":\"done\",\"id\":$__sc_id,\"status\":\"$__sc_status\",\"exit_code\":$__sc_last,\"execution_count\":$__sc_count,\"dropped\":{\"stdout\":0,\"stderr\":0}}"
            ;;
        is_complete)
            __sc_is_complete "$__sc_code"
            ;;
        get_vars | set_vars | clear_vars | list_vars)
            __sc_reply_error "variables are not supported for bash"
            ;;
        *)
            __sc_jstr "$__sc_op"
            __sc_reply_error "unknown op: $__sc_op"
            ;;
    esac
    __sc_line=
done
exit 0
