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
# Output goes straight to fds 1 and 2 (no stream events); `done` carries `exit_code`, and $?
# starts as the previous cell's status.
#
# The driver's own names start with `__sc_` (its functions are read-only). The two protocol
# pipes sit on high descriptors (250/251 when possible) and are closed while a cell runs, so
# user commands and their children (background jobs too) do not inherit them; a cell sees
# fds 61 (a copy of stdin) and 62 (its source, read to the end).
#
# What user code can do to the driver:
# - `exit`, `exec cmd`, `set -u` plus an unset variable, `${x:?}` and other fatal expansion
#   errors end the shell: the agent reports a crash (state lost).
# - `set -e` stops the cell at the failing command (status `error`, its exit code), not the
#   shell: while a cell runs, the ERR trap is the driver's (with `set -E`, so `$-` shows E),
#   and a user ERR trap runs first inside it (`trap -p ERR` shows that wrapper).
# - Interrupts (SIGINT): the driver's INT trap stops the cell between two commands (it
#   unwinds functions and the cell with `extdebug` and a DEBUG trap that returns 2), and done
#   says `interrupted` (exit_code 130). A foreground child only stops if it gets the signal
#   too (the agent signals the kernel's process group; bash runs traps only once the child
#   it waits for has ended). Background jobs ignore SIGINT, as in any non-interactive shell.
#   A user INT trap lasts until the end of its cell; SIGINT between cells is ignored.
# - A user DEBUG trap, -x and -v apply to cells (a prefix on the cell's first line sets them);
#   the DEBUG trap also runs before the driver's three commands right after a cell.
# - `set -n` (or -t) stops the driver too: the agent's grace period kills it.

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
__sc_prevflags=       # __sc_flags before the running cell
__sc_pre=             # the flags among them that the cell's prefix sets (-x, -v)
__sc_pipefail=0       # the user's pipefail, lastpipe and extdebug between cells
__sc_lastpipe=0
__sc_extdebug=0
__sc_uerr=            # the user's ERR trap (run before the driver's)
__sc_udbg=            # the user's DEBUG trap (lifted while the driver runs)
__sc_intr=0           # set by the INT trap
__sc_errexit=0        # set when the ERR trap stopped a cell under `set -e`
__sc_errst=0
__sc_reset_e=0        # set when the INT trap turned `set -e` off
__sc_unwound=0        # set when a cell was unwound (interrupt or errexit)

# --- JSON --------------------------------------------------------------------------------

# Control characters other than \t, \n and \r, and their JSON escapes.
__sc_ctrl=() __sc_ctrlesc=()
for ((__sc_i = 1; __sc_i < 32; __sc_i++)); do
    (( __sc_i == 9 || __sc_i == 10 || __sc_i == 13 )) && continue
    builtin printf -v __sc_r '\\x%02x' "$__sc_i"
    builtin printf -v __sc_r "$__sc_r"
    __sc_ctrl+=("$__sc_r")
    builtin printf -v __sc_r '\\u%04x' "$__sc_i"
    __sc_ctrlesc+=("$__sc_r")
done
unset __sc_i

# __sc_jstr STRING: sets __sc_r to STRING as a JSON string literal (quotes included).
__sc_jstr() {
    local LC_ALL=C s=$1 i
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\t'/\\t}
    s=${s//$'\r'/\\r}
    for ((i = 0; i < ${#__sc_ctrl[@]}; i++)); do
        [[ $s == *"${__sc_ctrl[i]}"* ]] && s=${s//"${__sc_ctrl[i]}"/"${__sc_ctrlesc[i]}"}
    done
    __sc_r="\"$s\""
}

# The JSON reader works on chunks of __sc_chunk bytes: bash's `${s//pattern/...}` rescans the
# rest of the string for each match, so substitutions on one long string cost its length
# times the number of matches. A chunk never ends inside an escape sequence (the tail is
# carried over to the next one). Placeholders: \x1e stands for an escaped backslash and
# \x1f for an escaped quote between __sc_parse and __sc_unescape.
__sc_chunk=4096

# 1 if printf %b turns \uXXXX into UTF-8 under LC_ALL=C.UTF-8.
__sc_ufast=0
__sc_check_ufast() {
    local LC_ALL=C.UTF-8 r
    builtin printf -v r '%b' '\u00e9\u6f22'
    LC_ALL=C
    [[ $r == $'\xc3\xa9\xe6\xbc\xa2' ]] && __sc_ufast=1
}
__sc_check_ufast 2>/dev/null
unset -f __sc_check_ufast

# __sc_unescape CONTENTS: sets __sc_r to the decoded JSON string CONTENTS.
__sc_unescape() {
    local LC_ALL=C s=$1 c carry= tail i n cp lo f len off=0 slow orig m
    local -a out p
    if [[ $s != *\\* ]]; then
        s=${s//$'\x1f'/\"}
        __sc_r=${s//$'\x1e'/\\}
        return
    fi
    len=${#s}
    while (( off < len || ${#carry} )); do
        c=$carry${s:off:__sc_chunk}
        off=$(( off + __sc_chunk ))
        carry=
        if (( off < len )); then
            # Carry an escape sequence cut by the chunk's end, and a high surrogate.
            tail=${c: -5}
            if [[ $tail == *\\* ]]; then
                tail=${tail##*\\}
                carry=${c: -$(( ${#tail} + 1 ))}
                c=${c:0:${#c}-${#carry}}
            fi
            if [[ ${c: -6} == \\u[dD][89abAB][0-9a-fA-F][0-9a-fA-F] ]]; then
                carry=${c: -6}$carry
                c=${c:0:${#c}-6}
            fi
        fi
        # printf %b decodes the escapes once the placeholders are escapes again; it knows
        # \uXXXX (in a UTF-8 locale), and surrogate pairs become \UXXXXXXXX.
        c=${c//\\\//\/}
        slow=0
        if [[ $c == *\\u* ]]; then
            if (( __sc_ufast )); then
                orig=$c
                c=${c//\\u0000/}
                while :; do
                    m=${c%%\\u[dD][89abAB][0-9a-fA-F][0-9a-fA-F]\\u[dD][c-fC-F][0-9a-fA-F][0-9a-fA-F]*}
                    (( ${#m} < ${#c} )) || break
                    m=${c:${#m}:12}
                    cp=$(( 0x10000 + ((16#${m:2:4} - 0xD800) << 10) + (16#${m:8:4} - 0xDC00) ))
                    builtin printf -v f '\\U%08x' "$cp"
                    c=${c//"$m"/"$f"}
                done
                [[ $c == *\\u[dD][89a-fA-F]* ]] && slow=1 c=$orig
            else
                slow=1
            fi
        fi
        if (( ! slow )); then
            c=${c//$'\x1e'/\\\\}
            c=${c//$'\x1f'/\"}
            LC_ALL=C.UTF-8
            builtin printf -v c '%b' "$c"
            LC_ALL=C
            out+=("$c")
            continue
        fi
        # Otherwise piece by piece, so that decoded characters never meet the placeholders.
        c=${c//\\n/$'\n'}
        c=${c//\\t/$'\t'}
        c=${c//\\r/$'\r'}
        c=${c//\\b/$'\b'}
        c=${c//\\f/$'\f'}
        {
            local IFS='\'
            local -
            builtin set -f
            p=($c)
        }
        n=${#p[@]}
        c=${p[0]//$'\x1f'/\"}
        out+=("${c//$'\x1e'/\\}")
        for ((i = 1; i < n; i++)); do
            c=${p[i]}
            if [[ $c != u[0-9a-fA-F][0-9a-fA-F][0-9a-fA-F][0-9a-fA-F]* ]]; then
                c=\\$c # not JSON: keep it
            else
                cp=$(( 16#${c:1:4} ))
                c=${c:5}
                if (( cp >= 0xD800 && cp < 0xDC00 && i + 1 < n )) && [[ -z $c \
                    && ${p[i+1]} == u[dD][c-fC-F][0-9a-fA-F][0-9a-fA-F]* ]]; then
                    i=$(( i + 1 ))
                    lo=$(( 16#${p[i]:1:4} ))
                    cp=$(( 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00) ))
                    c=${p[i]:5}
                fi
                (( cp >= 0xD800 && cp < 0xE000 )) && cp=0xFFFD # a lone surrogate
                if (( cp < 0x80 )); then
                    builtin printf -v f '\\x%02x' "$cp"
                elif (( cp < 0x800 )); then
                    builtin printf -v f '\\x%02x\\x%02x' $(( 0xC0 | cp >> 6 )) \
                        $(( 0x80 | (cp & 0x3F) ))
                elif (( cp < 0x10000 )); then
                    builtin printf -v f '\\x%02x\\x%02x\\x%02x' $(( 0xE0 | cp >> 12 )) \
                        $(( 0x80 | ((cp >> 6) & 0x3F) )) $(( 0x80 | (cp & 0x3F) ))
                else
                    builtin printf -v f '\\x%02x\\x%02x\\x%02x\\x%02x' $(( 0xF0 | cp >> 18 )) \
                        $(( 0x80 | ((cp >> 12) & 0x3F) )) $(( 0x80 | ((cp >> 6) & 0x3F) )) \
                        $(( 0x80 | (cp & 0x3F) ))
                fi
                builtin printf -v f "$f"
                out+=("$f")
            fi
            c=${c//$'\x1f'/\"}
            out+=("${c//$'\x1e'/\\}")
        done
    done
    local IFS=
    __sc_r="${out[*]}"
}

# __sc_parse LINE: reads the top-level members op, id and code of a request into __sc_op,
# __sc_id (the number as sent) and __sc_code (decoded). Returns 1 if LINE is not an object.
__sc_parse() {
    local LC_ALL=C s=$1 c carry= tok key= colon=0 depth=0 lit i j n off=0 len
    local -a t out
    __sc_op= __sc_id= __sc_code=
    # Hide the escaped backslashes and quotes (every backslash of JSON text is inside a
    # string): then each `"` left starts or ends a string.
    if [[ $s == *\\* ]]; then
        len=${#s}
        while (( off < len || ${#carry} )); do
            c=$carry${s:off:__sc_chunk}
            off=$(( off + __sc_chunk ))
            c=${c//\\\\/$'\x1e'}
            carry=
            if [[ $c == *\\ ]] && (( off < len )); then
                carry=\\
                c=${c%\\}
            fi
            out+=("${c//\\\"/$'\x1f'}")
        done
        local IFS=
        s="${out[*]}"
    fi
    # Split at the quotes: even pieces are structure, odd ones string contents.
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

__sc_status() {
    return "$1"
}

# __sc_trap_text LINE: sets __sc_r to the command of a `trap -p` LINE (empty if none).
__sc_trap_text() {
    __sc_r=
    [[ $1 == "trap -- "* ]] && builtin eval "__sc_trap_grab ${1#trap }"
}
__sc_trap_grab() {
    __sc_r=$2
}

# The INT trap while a cell runs: start unwinding.
__sc_on_int() {
    __sc_intr=1
    # The unwind's returns must not trip errexit (put back after the cell).
    if [[ $- == *e* ]]; then
        builtin set +e
        __sc_reset_e=1
    fi
    __sc_unwind_start
}

# The ERR trap while a cell runs is `__sc_err1; __sc_err2`, or with the user's own ERR trap
# CMD: `__sc_err1 || { __sc_status "$__sc_errst0"; CMD }; __sc_err2`. Under `set -e` it
# stops the cell instead of the shell. __sc_err1 notes the status, turns errexit off (the
# shell would exit after the trap) and fails unless the failed command is the driver's `.`
# (whose failure the user's trap has seen already); __sc_err2 starts the unwind, or exits a
# subshell as errexit would.
__sc_err1() {
    __sc_errst0=$?
    (( __sc_unwound )) && return 0
    if [[ $- == *e* ]]; then
        builtin set +e
        __sc_errexit=1 __sc_errst=$__sc_errst0
    fi
    [[ $BASH_COMMAND == "builtin . /dev/fd/62" ]]
}
__sc_err2() {
    if (( __sc_errexit )); then
        [[ $BASHPID == "$$" ]] || exit "$__sc_errst"
        (( __sc_unwound )) || __sc_unwind_start
    fi
    return 0
}

__sc_unwind_start() {
    __sc_unwound=1
    builtin shopt -s extdebug
    builtin trap '__sc_unwind' DEBUG
}

# With extdebug, a DEBUG trap that returns 2 makes the function or sourced file it runs in
# return: every command of the cell, at every depth, returns until the cell's `.` is done.
# (The driver's own functions, such as the ERR trap's, are left alone.)
__sc_unwind() {
    [[ $BASH_COMMAND != __sc_* && ${FUNCNAME[1]} != __sc_* \
        && " ${FUNCNAME[*]:1} " == *" source "* ]] && return 2
    return 0
}

# Runs right before the cell's `.`: puts back the user's options and the ERR trap.
__sc_enter() {
    builtin trap '__sc_on_int' INT
    builtin shopt -u lastpipe
    (( __sc_lastpipe )) && builtin shopt -s lastpipe
    (( __sc_extdebug )) && builtin shopt -s extdebug
    (( __sc_pipefail )) && builtin set -o pipefail
    if [[ -n $__sc_uerr ]]; then
        builtin trap "__sc_err1 || { __sc_status \"\$__sc_errst0\"; $__sc_uerr"$'\n''}; __sc_err2' ERR
    else
        builtin trap '__sc_err1; __sc_err2' ERR
    fi
    builtin set -E
    local f=${__sc_flags//[!aCeEfkmTub]/}
    [[ -n $f ]] && builtin set "-$f"
    # $? for the cell is the previous cell's status (unless that would trip an ERR trap).
    if [[ $f != *e* && -z $__sc_uerr ]]; then
        return "$__sc_last"
    fi
    return 0
}

# Runs first in the cell (a prefix on its first line) when the user has a DEBUG trap, -x or
# -v, so that they apply to the cell's commands and not to the driver's.
__sc_prefix() {
    if [[ -n $__sc_udbg ]] && (( ! __sc_unwound )); then
        [[ -n $__sc_pre ]] && builtin set "-$__sc_pre"
        builtin trap -- "$__sc_udbg" DEBUG
    else
        builtin set "-$__sc_pre"
    fi
}

# Runs after the cell: records what the user changed.
__sc_after() {
    local rerr=${__sc_rt%%$'\x1d'*} rdbg=${__sc_rt#*$'\x1d'}
    rerr=${rerr%$'\n'}
    if (( __sc_unwound )); then
        # The unwind replaced the DEBUG trap and turned extdebug (and -E, -T) on.
        __sc_flags=${__sc_flags//T/}${__sc_prevflags//[!T]/}
    else
        __sc_extdebug=0
        builtin shopt -q extdebug && __sc_extdebug=1
        __sc_trap_text "$rdbg"
        __sc_udbg=$__sc_r
    fi
    builtin shopt -u extdebug
    __sc_flags=${__sc_flags//E/}
    (( __sc_errexit || __sc_reset_e )) && __sc_flags+=e
    case $rerr in
        "trap -- '__sc_err1"*) ;;
        '') __sc_uerr= ;;
        *)
            __sc_trap_text "$rerr"
            __sc_uerr=$__sc_r
            ;;
    esac
}

# --- start -------------------------------------------------------------------------------

builtin readonly -f __sc_jstr __sc_unescape __sc_parse __sc_send __sc_reply_error \
    __sc_is_complete __sc_status __sc_trap_text __sc_trap_grab __sc_on_int __sc_err1 __sc_err2 \
    __sc_unwind_start __sc_unwind __sc_enter __sc_prefix __sc_after
builtin trap '' INT
__sc_jstr "$BASH_VERSION"
__sc_send "{\"type\":\"ready\",\"language\":\"bash\",\"version\":$__sc_r,\"pid\":$$}"

while IFS= builtin read -r -u "$__sc_ctl" __sc_line || [[ -n $__sc_line ]]; do
    # A SIGINT from now on is for this request: it unwinds the cell as soon as it starts.
    builtin trap '__sc_on_int' INT
    if ! __sc_parse "$__sc_line"; then
        __sc_id= __sc_op=:invalid
    elif [[ $__sc_id != ?(-)+([0-9]) ]]; then
        __sc_id= __sc_op=:noid
    fi
    case $__sc_op in
        execute)
            __sc_count=$(( __sc_count + 1 ))
            __sc_errexit=0 __sc_reset_e=0
            __sc_prevflags=$__sc_flags
            __sc_pre=${__sc_flags//[!xv]/}
            [[ -n $__sc_pre || -n $__sc_udbg ]] && __sc_code="__sc_prefix;$__sc_code"
            builtin shopt -s lastpipe
            # The cell's source goes through a pipe to `.`, which runs in this shell
            # (lastpipe) with the user's stdin and without the protocol pipes. Right after
            # it, the user's state is saved (a user DEBUG trap still runs before these three
            # commands; their stderr, where -x traces them, is discarded).
            {
                builtin printf '%s' "$__sc_code" | {
                    __sc_enter
                    builtin . /dev/fd/62
                    {
                        __sc_st=$? __sc_flags=$- __sc_rt=$(builtin trap -p ERR; builtin printf '\x1d'; builtin trap -p DEBUG)
                        builtin set +xv
                        builtin trap - DEBUG
                    } 2>/dev/null
                } 62<&0 0<&61
            } 61<&0 {__sc_ctl}<&- {__sc_ev}>&-
            builtin trap '' INT
            builtin trap - DEBUG ERR
            builtin set +aCeEfkmTuvxb
            __sc_pipefail=0 __sc_lastpipe=0
            [[ -o pipefail ]] && __sc_pipefail=1
            builtin set +o pipefail
            builtin shopt -q lastpipe && __sc_lastpipe=1
            __sc_after
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
        :invalid)
            __sc_reply_error "invalid request: not a JSON object"
            ;;
        :noid)
            __sc_reply_error "invalid request: no integer id"
            ;;
        get_vars | set_vars | clear_vars | list_vars)
            __sc_reply_error "variables are not supported for bash"
            ;;
        dump_state | load_state)
            __sc_reply_error "state capture is not supported for bash"
            ;;
        *)
            __sc_reply_error "unknown op: $__sc_op"
            ;;
    esac
    # Idle: SIGINT is ignored, and an interrupt of a request that was not a cell is dropped.
    builtin trap '' INT
    builtin trap - DEBUG
    builtin shopt -u extdebug
    __sc_line= __sc_intr=0 __sc_unwound=0
done
exit 0
