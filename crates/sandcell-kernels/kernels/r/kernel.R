# Sandcell R kernel: one Rscript process speaking PROTOCOL.md.
#
# Started by `Rscript -e`, which evaluates this program from $SANDCELL_KERNEL_SOURCE (Rscript
# drops `-e` programs of this size). Requests are JSON lines read from the control pipe,
# events JSON lines written to the event pipe (both opened through /dev/fd, close-on-exec;
# the inherited descriptors are closed). Cells are evaluated in .GlobalEnv, one top-level
# expression at a time, like at the R prompt:
# - output of cat()/print() (everything R writes to its output connection) is diverted with
#   sink() into a file and sent as stdout stream events after each top-level expression and
#   before each message, warning or error, so the order is kept; message() goes to stderr,
#   warnings are shown after the expression that raised them, as R does ("Warning
#   message:"); output written at the fd level (system(), C code) reaches fds 1/2 directly;
# - visible values are printed as at the prompt; the last expression's value, if visible,
#   is the `result` instead (text/plain), unless it is a plot object (ggplot2, lattice, grid),
#   which is drawn instead;
# - plots: the default device (options("device")) is a PNG device opened on demand; at the
#   end of the cell the devices it opened are closed and each page is sent as an image/png
#   display, after the cell's text;
# - errors stop the cell: an `error` event (ename = the condition's class), state is kept;
# - SIGINT: R signals an `interrupt` condition; the kernel catches it during a cell and
#   ignores it at other times (interrupts are suspended outside cells).
# The kernel's own state lives in the environment of the function below, not in .GlobalEnv.

local({
    ctl_fd <- Sys.getenv("SANDCELL_KERNEL_CTL_FD")
    ev_fd <- Sys.getenv("SANDCELL_KERNEL_EVENT_FD")
    if (!nzchar(ctl_fd) || !nzchar(ev_fd)) {
        cat("sandcell-kernel: SANDCELL_KERNEL_CTL_FD and SANDCELL_KERNEL_EVENT_FD must be set\n",
            file = stderr())
        quit(save = "no", status = 2)
    }
    # The protocol is UTF-8: make sure R can print it.
    if (!isTRUE(l10n_info()[["UTF-8"]])) {
        for (loc in c("C.UTF-8", "C.utf8", "en_US.UTF-8")) {
            if (nzchar(suppressWarnings(Sys.setlocale("LC_CTYPE", loc)))) break
        }
    }
    # "e": close-on-exec, so that system() children do not get the pipes.
    ctl <- file(sprintf("/dev/fd/%s", ctl_fd), open = "re", raw = TRUE)
    ev <- file(sprintf("/dev/fd/%s", ev_fd), open = "we", raw = TRUE)
    try(get("closeFD", asNamespace("parallel"))(as.integer(c(ctl_fd, ev_fd))), silent = TRUE)
    Sys.unsetenv(c("SANDCELL_KERNEL_CTL_FD", "SANDCELL_KERNEL_EVENT_FD", "SANDCELL_KERNEL_SOURCE"))
    stream_limit <- suppressWarnings(as.numeric(Sys.getenv("SANDCELL_STREAM_LIMIT", "1048576")))
    if (is.na(stream_limit) || stream_limit < 0) stream_limit <- 1048576
    work_dir <- tempfile("sandcell-r-")
    dir.create(work_dir, showWarnings = FALSE)
    out_path <- file.path(work_dir, "stdout")
    count <- 0L

    # --- JSON -------------------------------------------------------------------------

    b64_chars <- strsplit("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", "")[[1]]
    ctrl_chars <- intToUtf8(setdiff(1:31, c(9L, 10L, 13L)), multiple = TRUE)
    ctrl_esc <- sprintf("\\u%04x", setdiff(1:31, c(9L, 10L, 13L)))

    # Valid UTF-8 text from raw bytes (NULs dropped, invalid bytes replaced by U+FFFD).
    utf8_text <- function(bytes) {
        bytes <- bytes[bytes != as.raw(0)]
        s <- rawToChar(bytes)
        Encoding(s) <- "UTF-8"
        if (!validUTF8(s)) s <- iconv(s, "UTF-8", "UTF-8", sub = "\uFFFD")
        s
    }

    json_str <- function(s) {
        s <- enc2utf8(as.character(s))
        if (!validUTF8(s)) s <- iconv(s, "UTF-8", "UTF-8", sub = "\uFFFD")
        s <- gsub("\\", "\\\\", s, fixed = TRUE)
        s <- gsub("\"", "\\\"", s, fixed = TRUE)
        s <- gsub("\n", "\\n", s, fixed = TRUE)
        s <- gsub("\t", "\\t", s, fixed = TRUE)
        s <- gsub("\r", "\\r", s, fixed = TRUE)
        if (grepl("[\001-\037]", s, useBytes = TRUE)) {
            for (i in seq_along(ctrl_chars)) {
                s <- gsub(ctrl_chars[[i]], ctrl_esc[[i]], s, fixed = TRUE)
            }
        }
        paste0("\"", s, "\"")
    }

    # JSON text of a value: NULL -> null, a list with names -> object, other lists and
    # vectors of length != 1 -> arrays, a length-one vector -> scalar.
    to_json <- function(x) {
        if (is.null(x)) return("null")
        if (is.list(x)) {
            if (!is.null(names(x))) {
                inner <- vapply(names(x), function(k) paste0(json_str(k), ":", to_json(x[[k]])), "")
                return(paste0("{", paste(inner, collapse = ","), "}"))
            }
            return(paste0("[", paste(vapply(x, to_json, ""), collapse = ","), "]"))
        }
        if (inherits(x, "AsIs") || length(x) != 1L) {
            return(paste0("[", paste(vapply(as.list(unclass(x)), to_json, ""), collapse = ","), "]"))
        }
        if (is.character(x)) return(json_str(x))
        if (is.logical(x)) return(if (is.na(x)) "null" else if (x) "true" else "false")
        if (is.numeric(x)) {
            if (!is.finite(x)) return("null")
            return(if (x == round(x) && abs(x) < 1e15) format(x, scientific = FALSE) else format(x, digits = 17))
        }
        json_str(format(x))
    }

    unescape_map <- c("\"" = "\"", "\\" = "\\", "/" = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t")

    json_escape_pattern <- "\\\\u[dD][89abAB][0-9a-fA-F]{2}\\\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\\\u[0-9a-fA-F]{4}|\\\\."

    # Contents of a JSON string token (with its quotes), decoded. The regex functions work on
    # bytes: with character offsets they are quadratic on long non-ASCII text (a 200 KB cell
    # took 30 s); escapes are ASCII, so cutting at them keeps UTF-8 sequences whole.
    json_unstr <- function(tok) {
        s <- substr(tok, 2L, nchar(tok) - 1L)
        if (!grepl("\\", s, fixed = TRUE)) return(s)
        esc <- regmatches(s, gregexpr(json_escape_pattern, s, perl = TRUE, useBytes = TRUE))[[1]]
        parts <- strsplit(s, json_escape_pattern, perl = TRUE, useBytes = TRUE)[[1]]
        # strsplit drops the empty piece after an escape at the very end.
        if (length(parts) == length(esc)) parts <- c(parts, "")
        rep <- character(length(esc))
        simple <- nchar(esc) == 2L
        ch <- substr(esc[simple], 2L, 2L)
        known <- unname(unescape_map[ch])
        rep[simple] <- ifelse(is.na(known), ch, known)
        u <- which(!simple)
        if (length(u)) {
            cp <- strtoi(substr(esc[u], 3L, 6L), 16L)
            pair <- nchar(esc[u]) == 12L
            lo <- strtoi(substr(esc[u][pair], 9L, 12L), 16L)
            cp[pair] <- 65536L + (cp[pair] - 55296L) * 1024L + (lo - 56320L)
            cp[cp >= 55296L & cp < 57344L] <- 65533L
            chars <- intToUtf8(cp, multiple = TRUE)
            chars[cp == 0L] <- ""
            rep[u] <- chars
        }
        out <- paste0(c(rbind(parts, c(rep, ""))), collapse = "")
        Encoding(out) <- "UTF-8"
        out
    }

    json_pattern <- paste0(
        "\"(?:[^\"\\\\]++|\\\\.)*+\"",
        "|-?(?:0|[1-9][0-9]*+)(?:\\.[0-9]++)?(?:[eE][-+]?[0-9]++)?",
        "|true|false|null|[][{}:,]"
    )

    # Parses one JSON text (objects become named lists, arrays lists).
    json_parse <- function(txt) {
        m <- gregexpr(json_pattern, txt, perl = TRUE)
        toks <- regmatches(txt, m)[[1]]
        n <- length(toks)
        pos <- 1L
        nxt <- function() {
            if (pos > n) stop("unexpected end of JSON")
            t <- toks[[pos]]
            pos <<- pos + 1L
            t
        }
        value <- function() {
            t <- nxt()
            c1 <- substr(t, 1L, 1L)
            if (c1 == "{") {
                obj <- structure(list(), names = character(0))
                if (pos <= n && toks[[pos]] == "}") {
                    pos <<- pos + 1L
                    return(obj)
                }
                repeat {
                    k <- json_unstr(nxt())
                    if (nxt() != ":") stop("expected ':' in JSON object")
                    obj[k] <- list(value())
                    sep <- nxt()
                    if (sep == "}") break
                    if (sep != ",") stop("expected ',' or '}' in JSON object")
                }
                return(obj)
            }
            if (c1 == "[") {
                arr <- list()
                if (pos <= n && toks[[pos]] == "]") {
                    pos <<- pos + 1L
                    return(arr)
                }
                repeat {
                    arr[length(arr) + 1L] <- list(value())
                    sep <- nxt()
                    if (sep == "]") break
                    if (sep != ",") stop("expected ',' or ']' in JSON array")
                }
                return(arr)
            }
            if (c1 == "\"") return(json_unstr(t))
            if (t == "true") return(TRUE)
            if (t == "false") return(FALSE)
            if (t == "null") return(NULL)
            num <- suppressWarnings(as.numeric(t))
            if (is.na(num)) stop(sprintf("unexpected JSON token %s", t))
            num
        }
        value()
    }

    b64 <- function(bytes) {
        n <- length(bytes)
        if (n == 0L) return("")
        pad <- (3L - n %% 3L) %% 3L
        x <- as.integer(c(bytes, as.raw(integer(pad))))
        m <- matrix(x, nrow = 3L)
        v <- m[1L, ] * 65536L + m[2L, ] * 256L + m[3L, ]
        idx <- rbind(v %/% 262144L, (v %/% 4096L) %% 64L, (v %/% 64L) %% 64L, v %% 64L)
        chars <- b64_chars[idx + 1L]
        if (pad) chars[(length(chars) - pad + 1L):length(chars)] <- "="
        paste(chars, collapse = "")
    }

    # --- events -----------------------------------------------------------------------

    send <- function(...) {
        writeLines(paste0("{", paste0(..., collapse = ""), "}"), ev, useBytes = TRUE)
        flush(ev)
    }

    reply <- function(id, body) {
        send("\"type\":\"reply\",\"id\":", to_json(id), ",", body)
    }

    reply_error <- function(id, msg) {
        reply(id, paste0("\"error\":", json_str(msg)))
    }

    # Per-execution stream state (bytes sent, dropped, truncation marker sent).
    cur_id <- NULL
    sent <- c(stdout = 0, stderr = 0)
    dropped <- c(stdout = 0, stderr = 0)
    marked <- c(stdout = FALSE, stderr = FALSE)

    # Sends stream text, up to the per-stream limit.
    emit <- function(name, text) {
        if (!nzchar(text)) return(invisible())
        text <- enc2utf8(text)
        nb <- nchar(text, type = "bytes")
        room <- stream_limit - sent[[name]]
        if (nb <= room) {
            sent[[name]] <<- sent[[name]] + nb
            send("\"type\":\"stream\",\"id\":", cur_id, ",\"name\":\"", name, "\",\"text\":", json_str(text))
            return(invisible())
        }
        if (room > 0) {
            # The longest prefix of whole characters that fits.
            bytes <- charToRaw(text)[seq_len(room)]
            k <- length(bytes)
            cut <- k
            for (back in 0:min(3L, k - 1L)) {
                b <- as.integer(bytes[[k - back]])
                if (b < 0x80) break
                if (b >= 0xC0) {
                    need <- if (b >= 0xF0) 4L else if (b >= 0xE0) 3L else 2L
                    if (back + 1L < need) cut <- k - back - 1L
                    break
                }
            }
            if (cut > 0) {
                part <- rawToChar(bytes[seq_len(cut)])
                Encoding(part) <- "UTF-8"
                send("\"type\":\"stream\",\"id\":", cur_id, ",\"name\":\"", name, "\",\"text\":", json_str(part))
            }
            sent[[name]] <<- sent[[name]] + cut
            nb <- nb - cut
        }
        dropped[[name]] <<- dropped[[name]] + nb
        if (!marked[[name]]) {
            marked[[name]] <<- TRUE
            send("\"type\":\"stream\",\"id\":", cur_id, ",\"name\":\"", name, "\",\"text\":",
                json_str(sprintf("\n[sandcell: output truncated after %s bytes]\n", format(stream_limit, scientific = FALSE))))
        }
        invisible()
    }

    # --- output capture ---------------------------------------------------------------

    out_con <- NULL
    out_read <- NULL
    out_pos <- 0
    sink_base <- 0L

    capture_start <- function() {
        out_con <<- file(out_path, open = "w")
        out_read <<- file(out_path, open = "rb")
        out_pos <<- 0
        sink_base <<- sink.number()
        sink(out_con, type = "output")
    }

    # Sends what was written to the output connection since the last call (a multibyte
    # character cut at the end waits for the next call, unless `final`).
    capture_flush <- function(final = FALSE) {
        if (is.null(out_con)) return(invisible())
        flush(out_con)
        size <- file.size(out_path)
        if (is.na(size) || size <= out_pos) return(invisible())
        seek(out_read, out_pos)
        bytes <- readBin(out_read, "raw", n = size - out_pos)
        k <- length(bytes)
        if (!final && k > 0L) {
            for (back in 0:min(3L, k - 1L)) {
                b <- as.integer(bytes[[k - back]])
                if (b < 0x80) break
                if (b >= 0xC0) {
                    need <- if (b >= 0xF0) 4L else if (b >= 0xE0) 3L else 2L
                    if (back + 1L < need) k <- k - back - 1L
                    break
                }
            }
        }
        out_pos <<- out_pos + k
        if (k > 0L) emit("stdout", utf8_text(bytes[seq_len(k)]))
        invisible()
    }

    capture_stop <- function() {
        if (is.null(out_con)) return(invisible())
        # Take down the kernel's sink and any the cell left above it.
        while (sink.number() > sink_base) sink(type = "output")
        capture_flush(final = TRUE)
        close(out_con)
        close(out_read)
        out_con <<- NULL
        out_read <<- NULL
        invisible()
    }

    # --- plots ------------------------------------------------------------------------

    plot_devs <- integer(0)
    plot_seq <- 0L
    png_type <- if (isTRUE(capabilities("cairo"))) "cairo" else getOption("bitmapType")

    # The default device: a PNG file per page in the kernel's folder.
    sandcell_png <- function(...) {
        plot_seq <<- plot_seq + 1L
        grDevices::png(
            filename = file.path(work_dir, sprintf("plot-%05d-%05d-%%03d.png", count, plot_seq)),
            width = 7, height = 5, units = "in", res = 96, type = png_type
        )
        plot_devs <<- c(plot_devs, grDevices::dev.cur())
        invisible()
    }
    options(device = sandcell_png)

    # Closes the devices the cell opened and sends their pages.
    send_plots <- function() {
        for (d in intersect(plot_devs, grDevices::dev.list())) {
            try(grDevices::dev.off(d), silent = TRUE)
        }
        plot_devs <<- integer(0)
        files <- sort(list.files(work_dir, pattern = sprintf("^plot-%05d-.*\\.png$", count), full.names = TRUE))
        for (f in files) {
            size <- file.size(f)
            if (!is.na(size) && size > 0) {
                png_b64 <- b64(readBin(f, "raw", n = size))
                send("\"type\":\"display\",\"id\":", cur_id, ",\"data\":{\"image/png\":\"", png_b64,
                    "\",\"text/plain\":\"<plot>\"},\"metadata\":{}")
            }
            unlink(f)
        }
    }

    is_plot_object <- function(v) {
        inherits(v, c("ggplot", "gg", "trellis", "grob", "gtable", "gTree", "recordedplot"))
    }

    # --- executing ----------------------------------------------------------------------

    # Marks the frame user code runs in (see calls_of).
    sandcell_eval_user <- function(expr) eval(expr, envir = .GlobalEnv)
    kernel_eval_call <- quote(eval(expr, envir = .GlobalEnv))

    # The call a condition names, unless it is the kernel's own eval (a condition raised at
    # the top level of a cell, which R shows without a call).
    user_call <- function(cond) {
        call <- conditionCall(cond)
        if (identical(call, kernel_eval_call)) NULL else call
    }

    # Warnings are shown after the expression that raised them, as R does.
    format_warnings <- function(ws) {
        one <- function(w) {
            call <- user_call(w)
            msg <- conditionMessage(w)
            if (is.null(call)) msg else paste0("In ", deparse(call, nlines = 1L)[[1]], " : ", msg)
        }
        if (length(ws) == 1L) {
            paste0("Warning message:\n", one(ws[[1]]), "\n")
        } else {
            paste0("Warning messages:\n", paste0(seq_along(ws), ": ", vapply(ws, one, ""), "\n", collapse = ""))
        }
    }

    # The user's calls at a condition: between the kernel's eval and the condition handling.
    calls_of <- function(calls) {
        start <- 0L
        for (i in seq_along(calls)) {
            f <- calls[[i]][[1]]
            if (is.name(f) && identical(as.character(f), "sandcell_eval_user")) start <- i
        }
        if (start == 0L) return(list())
        calls <- calls[-seq_len(start)]
        # eval()'s own frames
        while (length(calls) && is.name(calls[[1]][[1]]) && as.character(calls[[1]][[1]]) == "eval") {
            calls <- calls[-1L]
        }
        keep <- integer(0)
        for (i in seq_along(calls)) {
            f <- calls[[i]][[1]]
            name <- if (is.name(f)) as.character(f) else ""
            if (name %in% c(".handleSimpleError", "h", ".signalSimpleWarning", "withCallingHandlers")) break
            keep <- c(keep, i)
        }
        # Like R's "Calls:" line, without the function that signalled (stop, warning).
        n <- length(keep)
        if (n && is.name(calls[[keep[[n]]]][[1]]) &&
            as.character(calls[[keep[[n]]]][[1]]) %in% c("stop", "warning", "signalCondition")) {
            keep <- keep[-n]
        }
        calls[keep]
    }

    execute <- function(id, code) {
        count <<- count + 1L
        cur_id <<- to_json(id)
        sent[] <<- 0
        dropped[] <<- 0
        marked[] <<- FALSE
        status <- "ok"
        cell <- sprintf("<cell %d>", count)
        exprs <- tryCatch(
            parse(text = code, keep.source = TRUE, srcfile = srcfilecopy(cell, code)),
            error = function(e) e
        )
        if (inherits(exprs, "error")) {
            msg <- conditionMessage(exprs)
            send("\"type\":\"error\",\"id\":", cur_id, ",\"ename\":\"ParseError\",\"evalue\":", json_str(msg),
                ",\"traceback\":", to_json(I(c(paste("Error in parse:", strsplit(msg, "\n")[[1]][[1]]),
                    strsplit(msg, "\n")[[1]][-1]))))
            send_done("error")
            return(invisible())
        }
        srcrefs <- attr(exprs, "srcref")
        warns <- list()
        err <- NULL
        err_calls <- list()
        err_at <- 0L
        result <- NULL
        capture_start()
        outcome <- tryCatch(
            allowInterrupts({
                withCallingHandlers(
                    {
                        for (i in seq_along(exprs)) {
                            err_at <- i
                            r <- withVisible(sandcell_eval_user(exprs[[i]]))
                            if (r$visible) {
                                if (i == length(exprs) && !is_plot_object(r$value)) {
                                    result <- r$value
                                    text <- paste(utils::capture.output(
                                        if (isS4(r$value)) methods::show(r$value) else print(r$value)
                                    ), collapse = "\n")
                                    Encoding(text) <- "UTF-8"
                                    result <- text
                                } else if (isS4(r$value)) {
                                    methods::show(r$value)
                                } else {
                                    print(r$value)
                                }
                            }
                            capture_flush()
                            if (length(warns)) {
                                emit("stderr", format_warnings(warns))
                                warns <- list()
                            }
                        }
                        "ok"
                    },
                    message = function(m) {
                        capture_flush()
                        emit("stderr", conditionMessage(m))
                        invokeRestart("muffleMessage")
                    },
                    warning = function(w) {
                        level <- getOption("warn", 0)
                        if (is.numeric(level) && level >= 2) return()
                        if (is.numeric(level) && level == 1) {
                            capture_flush()
                            call <- user_call(w)
                            emit("stderr", if (is.null(call)) paste0("Warning: ", conditionMessage(w), "\n")
                            else paste0("Warning in ", deparse(call, nlines = 1L)[[1]], " : ", conditionMessage(w), "\n"))
                        } else if (!is.numeric(level) || level >= 0) {
                            warns[[length(warns) + 1L]] <<- w
                        }
                        invokeRestart("muffleWarning")
                    },
                    error = function(e) {
                        err_calls <<- calls_of(sys.calls())
                    }
                )
            }),
            interrupt = function(e) "interrupted",
            error = function(e) {
                err <<- e
                "error"
            }
        )
        capture_stop()
        if (length(warns)) emit("stderr", format_warnings(warns))
        if (identical(outcome, "interrupted")) {
            status <- "interrupted"
            send("\"type\":\"error\",\"id\":", cur_id, ",\"ename\":\"Interrupted\",\"evalue\":\"interrupted by SIGINT\",\"traceback\":[]")
        } else if (identical(outcome, "error")) {
            status <- "error"
            msg <- conditionMessage(err)
            call <- user_call(err)
            head <- if (is.null(call)) paste0("Error: ", msg) else paste0("Error in ", deparse(call, nlines = 1L)[[1]], " : ", msg)
            tb <- strsplit(head, "\n", fixed = TRUE)[[1]]
            if (length(err_calls)) {
                names <- vapply(err_calls, function(cl) {
                    f <- cl[[1]]
                    if (is.name(f)) as.character(f) else deparse(f, nlines = 1L)[[1]]
                }, "")
                tb <- c(tb, paste("Calls:", paste(names, collapse = " -> ")))
            }
            if (err_at > 0L && !is.null(srcrefs) && err_at <= length(srcrefs)) {
                sr <- srcrefs[[err_at]]
                line <- sr[[1]]
                src <- as.character(sr)
                tb <- c(tb, sprintf("  %s, line %d: %s", cell, line, src[[1]]))
            }
            cls <- class(err)[[1]]
            send("\"type\":\"error\",\"id\":", cur_id, ",\"ename\":", json_str(cls), ",\"evalue\":", json_str(msg),
                ",\"traceback\":", to_json(I(tb)))
        }
        send_plots()
        if (status == "ok" && !is.null(result)) {
            send("\"type\":\"result\",\"id\":", cur_id, ",\"data\":{\"text/plain\":", json_str(result), "},\"metadata\":{}")
        }
        send_done(status)
        invisible()
    }

    send_done <- function(status) {
        send("\"type\":\"done\",\"id\":", cur_id, ",\"status\":\"", status, "\",\"execution_count\":", count,
            ",\"dropped\":{\"stdout\":", format(dropped[["stdout"]], scientific = FALSE),
            ",\"stderr\":", format(dropped[["stderr"]], scientific = FALSE), "}")
    }

    is_complete <- function(id, code) {
        status <- tryCatch(
            {
                parse(text = code, keep.source = FALSE)
                "complete"
            },
            error = function(e) {
                msg <- conditionMessage(e)
                lines <- length(strsplit(code, "\n", fixed = TRUE)[[1]])
                at <- regmatches(msg, regexec("^<text>:([0-9]+):([0-9]+):", msg))[[1]]
                past_end <- length(at) == 3L && as.integer(at[[2]]) > lines
                if (grepl("unexpected end of input", msg, fixed = TRUE) ||
                    grepl("INCOMPLETE_STRING", msg, fixed = TRUE) || past_end) "incomplete" else "invalid"
            }
        )
        reply(id, paste0("\"status\":\"", status, "\""))
    }

    handle <- function(line) {
        req <- tryCatch(json_parse(line), error = function(e) e)
        if (inherits(req, "error") || !is.list(req)) {
            reply_error(NULL, paste("invalid request:", if (inherits(req, "error")) conditionMessage(req) else "not an object"))
            return(invisible())
        }
        id <- req[["id"]]
        op <- req[["op"]]
        if (!is.numeric(id) || length(id) != 1L) {
            reply_error(NULL, "invalid request: no integer id")
            return(invisible())
        }
        if (!is.character(op) || length(op) != 1L) op <- ""
        code <- req[["code"]]
        if (op %in% c("execute", "is_complete") && (!is.character(code) || length(code) != 1L)) code <- ""
        switch(op,
            execute = execute(id, code),
            is_complete = is_complete(id, code),
            get_vars = ,
            set_vars = ,
            clear_vars = ,
            list_vars = reply_error(id, "variables are not supported for r"),
            dump_state = ,
            load_state = reply_error(id, "state capture is not supported for r"),
            reply_error(id, paste("unknown op:", op))
        )
    }

    version <- paste(R.version$major, R.version$minor, sep = ".")
    send("\"type\":\"ready\",\"language\":\"r\",\"version\":", json_str(version), ",\"pid\":", Sys.getpid())

    # Interrupts are suspended except while a cell runs (allowInterrupts in execute). One
    # that arrived meanwhile stays pending: Sys.sleep(0) raises it right after the next
    # request is read, and it is dropped here (the line read is kept).
    repeat {
        line <- NULL
        tryCatch({
            suspendInterrupts(line <- readLines(ctl, n = 1L, warn = FALSE, encoding = "UTF-8"))
            Sys.sleep(0)
        }, interrupt = function(e) NULL)
        if (is.null(line)) next
        if (length(line) == 0L) break
        tryCatch(
            suspendInterrupts(handle(line)),
            interrupt = function(e) NULL,
            error = function(e) {
                try(capture_stop(), silent = TRUE)
                try(reply_error(NULL, paste("kernel error:", conditionMessage(e))), silent = TRUE)
            }
        )
    }
    unlink(work_dir, recursive = TRUE)
    quit(save = "no", status = 0)
})
