//! `sandcell template build` through the real binary, on a home of its own. Offline first: a
//! busybox base imported from a root filesystem tarball, a Dockerfile with ARG, ENV, WORKDIR,
//! COPY, RUN and USER built into layers; a second build served wholly from the cache (the
//! same image, digest and all); a changed copied file rebuilding from its step on; a file
//! deleted by a step staying deleted (a whiteout); the store read back by umoci; refusals
//! with their line; a failing RUN exiting with its code and showing its output. Then with
//! the machine's Debian mirror: `apt-get install jq` through the build's egress proxy, and
//! `jq` running in a sandbox of the template.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use super::common::BIN;

/// The programs the busybox base of these builds has.
const TOOLS: &[&str] = &[
    "sh", "ls", "cat", "id", "touch", "echo", "rm", "mkdir", "wc", "head", "grep",
];

/// `sandcell template build --json` on `home`: exit code, events, stderr.
fn build(home: &Path, context: &Path, name: &str, extra: &[&str]) -> (i32, Vec<Value>, String) {
    let out = Command::new(BIN)
        .env("SANDCELL_HOME", home)
        .args(["template", "build", "--json", "-t", name])
        .args(extra)
        .arg(context)
        .output()
        .expect("run sandcell");
    let events = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (
        out.status.code().unwrap_or(-1),
        events,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `step_finished` reports, in order.
fn steps(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["event"] == "step_finished")
        .map(|e| &e["step"])
        .collect()
}

/// Everything the steps printed.
fn output(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["event"] == "output")
        .filter_map(|e| e["text"].as_str())
        .collect()
}

/// `sandcell run --template NAME -- sh -c SCRIPT` on `home`: its stdout.
fn run_on(home: &Path, name: &str, script: &str) -> String {
    let out = Command::new(BIN)
        .env("SANDCELL_HOME", home)
        .args(["run", "--template", name, "--", "sh", "-c", script])
        .output()
        .expect("run sandcell");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Imports the busybox base (`tools` linked) into `home` as `tiny:v1`; false (saying
/// "skipped") when the host has no busybox.
fn import_tiny(tmp: &Path, home: &Path, tools: &[&str]) -> bool {
    let Some(tarball) = super::daemon_templates::busybox_rootfs(tmp, tools) else {
        sandcell_testkit::skip::skip(
            "/bin/busybox is missing (scripts/setup.sh installs busybox-static)",
        );
        return false;
    };
    let (code, _, err) = super::images::sandcell(
        home,
        &["import", tarball.to_str().unwrap(), "--as", "tiny:v1"],
    );
    assert_eq!(code, 0, "{err}");
    true
}

pub(super) fn skip_unless_root() -> bool {
    if !rustix::process::geteuid().is_root() {
        sandcell_testkit::skip::skip("builds map a private id range: they need root");
        return true;
    }
    false
}

#[test]
fn a_dockerfile_builds_into_cached_layers_and_a_sandbox_runs_on_the_result() {
    if skip_unless_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    if !import_tiny(tmp.path(), &home, TOOLS) {
        return;
    }

    let ctx = tmp.path().join("ctx");
    std::fs::create_dir_all(ctx.join("src")).unwrap();
    std::fs::write(ctx.join("data.txt"), "data v1\n").unwrap();
    std::fs::write(ctx.join("src/tool.sh"), "echo tool\n").unwrap();
    // Left out of every copy by the context's .dockerignore.
    std::fs::write(ctx.join("src/debug.sh"), "echo debug\n").unwrap();
    std::fs::write(ctx.join(".dockerignore"), "# local only\nsrc/debug.sh\n").unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM tiny:v1\n\
         ARG WHO=world\n\
         ENV GREETING=hello\n\
         WORKDIR /app\n\
         COPY data.txt ./\n\
         COPY src/*.sh /app/bin/\n\
         RUN echo \"$GREETING $WHO\" > /greeting && rm /etc/os-release && id -u > /app/built-by\n\
         USER 1000:1000\n\
         RUN id -u && touch /app/denied 2>/dev/null || echo cannot write /app\n\
         EXPOSE 8080\n\
         CMD [\"sh\"]\n",
    )
    .unwrap();

    let (code, events, err) = build(&home, &ctx, "demo", &["--build-arg", "WHO=builder"]);
    assert_eq!(code, 0, "{err}\n{events:?}");
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "warning" && e["line"] == 10),
        "EXPOSE is warned about with its line: {events:?}"
    );
    let first = steps(&events);
    assert_eq!(first.len(), 5, "WORKDIR, 2 COPY, 2 RUN: {first:?}");
    assert!(
        first
            .iter()
            .all(|s| s["cached"] == false && s["layer"].is_string())
    );
    assert_eq!(first[3]["exit_code"], 0);
    let printed = output(&events);
    // USER 1000 runs as 1000, which cannot write the root's folder.
    assert!(printed.contains("1000\ncannot write /app"), "{printed}");
    let finished = events.last().unwrap();
    assert_eq!(finished["event"], "finished");
    assert_eq!(finished["state"], "succeeded");

    // A sandbox on the template: its files, the deletion, the variables of ENV and ARG.
    let out = run_on(
        &home,
        "demo",
        "cat /greeting /app/data.txt /app/bin/tool.sh /app/built-by; ls /etc/os-release 2>&1; ls /app/bin; echo $GREETING; pwd",
    );
    assert_eq!(
        out.lines().take(4).collect::<Vec<_>>(),
        ["hello builder", "data v1", "echo tool", "0"],
        "{out}"
    );
    assert!(out.contains("No such file"), "deleted stays deleted: {out}");
    assert!(
        out.contains("\ntool.sh\nhello"),
        ".dockerignore kept debug.sh out: {out}"
    );
    // Its commands start in the image's WORKDIR.
    assert!(out.ends_with("hello\n/app\n"), "{out}");

    // Again: every step from the cache, and the same image.
    let digest = || -> String {
        let (code, out, _) = super::images::sandcell(&home, &["inspect", "demo", "--json"]);
        assert_eq!(code, 0);
        serde_json::from_str::<Value>(&out).unwrap()["digest"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let before = digest();
    // A change to an ignored file changes no step.
    std::fs::write(ctx.join("src/debug.sh"), "echo changed\n").unwrap();
    let (code, events, err) = build(&home, &ctx, "demo", &["--build-arg", "WHO=builder"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        steps(&events).iter().all(|s| s["cached"] == true),
        "{events:?}"
    );
    assert_eq!(
        digest(),
        before,
        "a rebuild that changes nothing is the same image"
    );

    // A changed copied file: the steps before it come from the cache, it and those after run.
    std::fs::write(ctx.join("data.txt"), "data v2\n").unwrap();
    let (code, events, err) = build(&home, &ctx, "demo", &["--build-arg", "WHO=builder"]);
    assert_eq!(code, 0, "{err}");
    let cached: Vec<bool> = steps(&events)
        .iter()
        .map(|s| s["cached"].as_bool().unwrap())
        .collect();
    assert_eq!(cached, [true, false, false, false, false]);
    assert!(run_on(&home, "demo", "cat /app/data.txt").contains("data v2"));
    // --no-cache runs everything.
    let (code, events, _) = build(
        &home,
        &ctx,
        "demo",
        &["--no-cache", "--build-arg", "WHO=builder"],
    );
    assert_eq!(code, 0);
    assert!(steps(&events).iter().all(|s| s["cached"] == false));

    // The store is an OCI image layout a standard tool reads.
    if Command::new("umoci").arg("--version").output().is_ok() {
        let out = Command::new("umoci")
            .args(["ls", "--layout"])
            .arg(home.join("images"))
            .output()
            .unwrap();
        let names = String::from_utf8_lossy(&out.stdout);
        assert!(names.lines().any(|l| l == "demo:latest"), "{names}");
        let bundle = tmp.path().join("bundle");
        let out = Command::new("umoci")
            .args(["unpack", "--rootless", "--image"])
            .arg(format!("{}:demo:latest", home.join("images").display()))
            .arg(&bundle)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            std::fs::read_to_string(bundle.join("rootfs/greeting")).unwrap(),
            "hello builder\n"
        );
        assert!(
            !bundle.join("rootfs/etc/os-release").exists(),
            "the whiteout applies"
        );
    } else {
        sandcell_testkit::skip::skip("umoci is not installed: the layout is not read back");
    }
}

#[test]
fn copy_chown_owns_what_it_makes_and_chmod_keeps_folders_enterable() {
    if skip_unless_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    if !import_tiny(tmp.path(), &home, TOOLS) {
        return;
    }
    let ctx = tmp.path().join("ctx");
    std::fs::create_dir_all(ctx.join("conf")).unwrap();
    std::fs::write(ctx.join("data.txt"), "d\n").unwrap();
    std::fs::write(ctx.join("conf/app.ini"), "x=1\n").unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM tiny:v1\n\
         COPY --chown=1000:1001 data.txt /srv/app/data/\n\
         COPY --chmod=640 conf /srv/conf/\n\
         COPY data.txt /srv/app/plain.txt\n",
    )
    .unwrap();
    let (code, events, err) = build(&home, &ctx, "owned", &[]);
    assert_eq!(code, 0, "{err}\n{events:?}");
    // Read on the host, in the image's unpacked root (inside, ids other than the sandbox
    // user's show as nobody).
    let root = std::fs::read_dir(home.join("images/roots"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("srv").exists())
        .expect("the built image's root");
    let out: String = [
        "/srv",
        "/srv/app",
        "/srv/app/data",
        "/srv/app/data/data.txt",
        "/srv/conf",
        "/srv/conf/app.ini",
        "/srv/app/plain.txt",
    ]
    .iter()
    .map(|p| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(root.join(&p[1..])).unwrap();
        format!("{p} {}:{} {:o}\n", m.uid(), m.gid(), m.mode() & 0o7777)
    })
    .collect();
    assert_eq!(
        out,
        "/srv 1000:1001 755\n\
         /srv/app 1000:1001 755\n\
         /srv/app/data 1000:1001 755\n\
         /srv/app/data/data.txt 1000:1001 644\n\
         /srv/conf 0:0 750\n\
         /srv/conf/app.ini 0:0 640\n\
         /srv/app/plain.txt 0:0 644\n",
        "folders made by --chown are its owner's, those already there keep theirs"
    );
}

#[test]
fn bad_dockerfiles_and_failing_steps_fail_clearly() {
    if skip_unless_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    if !import_tiny(tmp.path(), &home, TOOLS) {
        return;
    }
    let ctx = tmp.path().join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    let dockerfile = |text: &str| std::fs::write(ctx.join("Dockerfile"), text).unwrap();

    // A failing RUN: the build exits with its code, its output is in the log.
    dockerfile(
        "FROM tiny:v1\nRUN echo made > /a\nRUN echo about to fail; exit 7\nRUN echo never\n",
    );
    let (code, events, err) = build(&home, &ctx, "broken", &[]);
    assert_eq!(code, 7, "{err}");
    assert!(output(&events).contains("about to fail"), "{events:?}");
    let reports = steps(&events);
    assert_eq!(reports.len(), 2, "the third step never starts: {reports:?}");
    assert_eq!(reports[1]["exit_code"], 7);
    assert_eq!(events.last().unwrap()["state"], "failed");
    assert!(
        err.contains("step 2") && err.contains("exit code 7"),
        "{err}"
    );
    let (code, _, _) = super::images::sandcell(&home, &["inspect", "broken"]);
    assert_ne!(code, 0, "a failed build tags nothing");

    // Refusals, before any step runs, each naming what is wrong.
    for (text, expect) in [
        ("FROM tiny:v1\nRUN true\nONBUILD RUN x\n", "line 3"),
        (
            "FROM tiny:v1\nCOPY ../outside /x\n",
            "leaves the build context",
        ),
        ("FROM ubuntu:22.04\nRUN true\n", "sandcell image import"),
        ("FROM host\nRUN true\n", "FROM host cannot be built on"),
        ("FROM tiny:v1\nCOPY missing.txt /x\n", "matches nothing"),
    ] {
        dockerfile(text);
        let (code, _, err) = build(&home, &ctx, "refused", &[]);
        assert_ne!(code, 0, "{text}");
        assert!(err.contains(expect), "{text}: {err}");
    }
    let (code, _, err) = build(&home, &ctx, "Bad Name", &[]);
    assert_ne!(code, 0);
    assert!(err.contains("not a template or image name"), "{err}");
}

/// The Debian base of these tests, made once per machine with mmdebstrap into a store under
/// the build's scratch folder, then imported from there (an OCI layout) into `home`.
pub(super) fn debian_base(home: &Path) -> bool {
    if Command::new("mmdebstrap")
        .arg("--version")
        .output()
        .is_err()
    {
        sandcell_testkit::skip::skip("mmdebstrap is not installed (scripts/setup.sh installs it)");
        return false;
    }
    let cache_home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("debian-home");
    let (code, _, err) = super::images::sandcell(&cache_home, &["base", "debian:bookworm"]);
    assert_eq!(code, 0, "{err}");
    let layout = cache_home.join("images");
    let (code, _, err) = super::images::sandcell(
        home,
        &[
            "import",
            layout.to_str().unwrap(),
            "--pick",
            "debian:bookworm",
            "--as",
            "debian:bookworm",
        ],
    );
    assert_eq!(code, 0, "{err}");
    true
}

#[test]
fn apt_get_reaches_the_mirror_through_the_build_proxy_and_the_package_runs_in_a_sandbox() {
    if skip_unless_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    if !debian_base(&home) {
        return;
    }
    let ctx = tmp.path().join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM debian:bookworm\n\
         RUN --mount=type=cache,target=/var/cache/apt --mount=type=cache,target=/var/lib/apt/lists \\\n\
             apt-get update && apt-get install -y --no-install-recommends jq\n\
         RUN echo '{\"a\": 41}' | jq .a\n",
    )
    .unwrap();
    let (code, events, err) = build(&home, &ctx, "jq", &[]);
    assert_eq!(code, 0, "{err}\n{}", output(&events));
    assert!(output(&events).contains("41"), "jq ran in the next step");
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "network" && e["outcome"] == "allowed"),
        "apt went through the build's proxy: {events:?}"
    );
    // The package caches stayed outside the layer: jq and its libraries are a few MB.
    let install = steps(&events)[0];
    assert!(install["size"].as_u64().unwrap() < 20 << 20, "{install}");
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "smoke" && e["kernel"] == "bash" && e["ok"] == true),
        "{events:?}"
    );
    let out = run_on(&home, "jq", "echo '{\"b\": [1,2,3]}' | jq '.b | length'");
    assert_eq!(out, "3\n");

    // A host the template does not allow is refused by the proxy, and the step says so.
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM debian:bookworm\nSHELL [\"/bin/bash\", \"-c\"]\nRUN exec 3<>/dev/tcp/127.0.0.1/3128 && printf 'GET http://not-allowed.invalid/ HTTP/1.1\\r\\nHost: not-allowed.invalid\\r\\n\\r\\n' >&3 && head -1 <&3\n",
    )
    .unwrap();
    let (code, events, err) = build(&home, &ctx, "denied", &["--no-cache"]);
    assert_eq!(code, 0, "{err}\n{}", output(&events));
    assert!(output(&events).contains("403"), "{}", output(&events));
    assert!(
        events.iter().any(|e| e["event"] == "network"
            && e["outcome"] == "denied"
            && e["host"] == "not-allowed.invalid"),
        "{events:?}"
    );
}

#[test]
fn a_build_step_cannot_leave_its_sandbox_or_change_the_base() {
    if skip_unless_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let tools = [TOOLS, &["mount", "unshare", "chroot"]].concat();
    if !import_tiny(tmp.path(), &home, &tools) {
        return;
    }
    let ctx = tmp.path().join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM tiny:v1\n\
         RUN mount -t tmpfs none /mnt 2>/dev/null && echo MOUNTED || echo mount-refused; \\\n\
             unshare -U true 2>/dev/null && echo USERNS || echo unshare-refused; \\\n\
             chroot / true 2>/dev/null && echo CHROOT || echo chroot-refused; \\\n\
             echo 1 > /proc/sys/kernel/sysrq 2>/dev/null && echo SYSCTL || echo sysctl-refused; \\\n\
             grep CapEff /proc/self/status; \\\n\
             echo tampered > /etc/os-release && echo base-copy-changed\n",
    )
    .unwrap();
    let (code, events, err) = build(&home, &ctx, "attack", &["--offline"]);
    assert_eq!(code, 0, "{err}\n{}", output(&events));
    let printed = output(&events);
    for refused in ["mount-refused", "unshare-refused", "sysctl-refused"] {
        assert!(printed.contains(refused), "{refused}: {printed}");
    }
    // Docker's build set: chown, dac_override, fowner, fsetid, kill, setgid, setuid, setpcap,
    // net_bind_service, sys_chroot, mknod, audit_write, setfcap; never sys_admin (bit 21).
    assert!(printed.contains("CapEff:\t00000000a80405fb"), "{printed}");
    assert!(printed.contains("base-copy-changed"), "{printed}");
    // The step changed its own copy: the base's unpacked root on the host is untouched (the
    // other root is the finished template's).
    let roots: Vec<_> = std::fs::read_dir(home.join("images/roots"))
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    let mut seen: Vec<String> = roots
        .iter()
        .map(|r| std::fs::read_to_string(r.path().join("etc/os-release")).unwrap())
        .collect();
    seen.sort();
    assert_eq!(seen, ["ID=tiny\n", "tampered\n"]);
    let out = run_on(&home, "attack", "cat /etc/os-release");
    assert_eq!(out, "tampered\n", "the template has the step's change");
}

/// `dir` as a gzip tar, base64-encoded (a build context for the REST API).
fn context_base64(dir: &Path, tmp: &Path) -> String {
    use base64::Engine as _;
    let tarball = tmp.join("context.tar.gz");
    super::images::tar_folder(dir, &tarball);
    base64::engine::general_purpose::STANDARD.encode(std::fs::read(&tarball).unwrap())
}

#[test]
fn the_daemon_builds_a_template_as_a_job_whose_log_streams_and_guards_it_while_in_use() {
    use reqwest::Method;
    use std::time::Instant;

    if skip_unless_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut d = super::daemon::Daemon::start(&[]);
    if !import_tiny(tmp.path(), d.home(), TOOLS) {
        return;
    }
    let ctx = tmp.path().join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(ctx.join("motd"), "built over REST\n").unwrap();
    let dockerfile = "FROM tiny:v1\nCOPY motd /etc/motd\nRUN echo step output && sleep 1\nENV MODE=rest\nWORKDIR /workspace/proj\n";
    let context = context_base64(&ctx, tmp.path());

    // Bad input: answered at once, naming what is wrong.
    let r = d.post(
        "/v1/templates",
        json!({"name": "rest", "dockerfile": "FROM tiny:v1\nONBUILD RUN x\n"}),
    );
    r.expect_error(400, "invalid_argument");
    assert!(
        r.body["message"].as_str().unwrap().contains("line 2"),
        "{}",
        r.body
    );
    let r = d.post(
        "/v1/templates",
        json!({"name": "rest", "dockerfile": dockerfile, "context": "not base64!"}),
    );
    r.expect_error(400, "invalid_argument");
    let (bob, _) = d.key_for("bob");
    let r = d.call_as(
        Some(&bob),
        Method::POST,
        "/v1/templates",
        Some(json!({"name": "rest", "dockerfile": dockerfile})),
    );
    r.expect_error(403, "permission_denied");

    // A build: 202 at once, its log followed live to its end.
    let r = d.post(
        "/v1/templates",
        json!({"name": "rest:v1", "dockerfile": dockerfile, "context": context}),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    let id = r.body["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("bld-"), "{id}");
    let start = Instant::now();
    let resp = d
        .req(Method::GET, &format!("/v1/builds/{id}/logs"))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let events = super::daemon::read_sse(resp, start);
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names.first(), Some(&"base"), "{names:?}");
    assert_eq!(names.last(), Some(&"finished"), "{names:?}");
    assert!(names.contains(&"step_started") && names.contains(&"step_finished"));
    let output: String = events
        .iter()
        .filter(|e| e.name == "output")
        .filter_map(|e| e.data["text"].as_str())
        .collect();
    assert!(output.contains("step output"), "{output}");
    // Live: the output came before the step's end (the step sleeps after printing).
    let at = |name: &str| events.iter().find(|e| e.name == name).unwrap().at;
    assert!(at("output") + std::time::Duration::from_millis(500) < at("finished"));

    let r = d.get(&format!("/v1/builds/{id}"));
    assert_eq!(r.status, 200);
    assert_eq!(r.body["state"], "succeeded", "{}", r.body);
    assert_eq!(r.body["steps"], 3);
    assert_eq!(r.body["step_reports"].as_array().unwrap().len(), 3);
    assert_eq!(r.body["image"]["reference"], "rest:v1");
    // The stored log as JSON, from an event on.
    let r = d.get(&format!("/v1/builds/{id}/logs?format=json&after=1"));
    assert_eq!(r.body["events"][0]["seq"], 2, "{}", r.body);
    let r = d.get("/v1/builds");
    assert_eq!(r.body["builds"][0]["id"], id.as_str());

    let r = d.get("/v1/templates");
    let names: Vec<&str> = r.body["templates"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["rest:v1", "tiny:v1"]);
    let r = d.get("/v1/templates/rest:v1");
    assert_eq!(
        r.body["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| *e == "MODE=rest")
            .count(),
        1
    );
    assert_eq!(r.body["sandboxes"], 0);

    // A sandbox on it: its files and ENV; the template cannot be deleted meanwhile.
    let sb = d.create_id(json!({"template": "rest:v1"}));
    // Commands start in its WORKDIR, made in the sandbox's own /workspace.
    let out = d.exec(&sb, "cat /etc/motd; echo $MODE; pwd");
    assert_eq!(
        out.stdout, "built over REST\nrest\n/workspace/proj\n",
        "{}",
        out.stderr
    );
    assert_eq!(d.get("/v1/templates/rest:v1").body["sandboxes"], 1);
    d.delete("/v1/templates/rest:v1")
        .expect_error(409, "invalid_state");
    assert_eq!(d.delete(&format!("/v1/sandboxes/{sb}")).status, 204);
    assert_eq!(d.delete("/v1/templates/rest:v1").status, 204);
    d.get("/v1/templates/rest:v1")
        .expect_error(404, "not_found");

    // A failing build, and a cancelled one.
    let r = d.post(
        "/v1/templates",
        json!({"name": "fails", "dockerfile": "FROM tiny:v1\nRUN exit 3\n", "wait": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["state"], "failed");
    assert_eq!(r.body["exit_code"], 3);
    let r = d.post(
        "/v1/templates",
        json!({"name": "slow", "dockerfile": "FROM tiny:v1\nRUN sleep 60\n"}),
    );
    let slow = r.body["id"].as_str().unwrap().to_string();
    super::daemon::wait_for(std::time::Duration::from_secs(20), || {
        (d.get(&format!("/v1/builds/{slow}")).body["state"] == "running").then_some(())
    })
    .expect("the slow build runs");
    let cancelled = Instant::now();
    let r = d.post(&format!("/v1/builds/{slow}/cancel"), json!({}));
    assert_eq!(r.body["state"], "cancelled", "{}", r.body);
    assert!(cancelled.elapsed() < std::time::Duration::from_secs(20));

    // Builds are kept across restarts, with their logs; one the daemon died during ends as
    // failed, saying so.
    let r = d.post(
        "/v1/templates",
        json!({"name": "cut", "dockerfile": "FROM tiny:v1\nRUN echo first\nRUN sleep 3\n"}),
    );
    let cut = r.body["id"].as_str().unwrap().to_string();
    super::daemon::wait_for(std::time::Duration::from_secs(20), || {
        (d.get(&format!("/v1/builds/{cut}")).body["step"] == 2).then_some(())
    })
    .expect("the build reaches its second step");
    let before = d.get(&format!("/v1/builds/{id}")).body;
    let log_before = d.get(&format!("/v1/builds/{id}/logs?format=json")).body;
    d.kill9();
    d.restart(&[]);
    assert_eq!(d.get(&format!("/v1/builds/{id}")).body, before);
    assert_eq!(
        d.get(&format!("/v1/builds/{id}/logs?format=json")).body,
        log_before
    );
    assert_eq!(
        d.get(&format!("/v1/builds/{slow}")).body["state"],
        "cancelled"
    );
    let r = d.get(&format!("/v1/builds/{cut}"));
    assert_eq!(r.body["state"], "failed", "{}", r.body);
    assert!(
        r.body["error"].as_str().unwrap().contains("daemon stopped"),
        "{}",
        r.body
    );
    assert_eq!(
        r.body["step_reports"].as_array().unwrap().len(),
        1,
        "the step it got through: {}",
        r.body
    );
    let listed: Vec<String> = d.get("/v1/builds").body["builds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed[0], cut, "newest first: {listed:?}");
    assert!(listed.contains(&id) && listed.contains(&slow));
}

#[test]
fn built_in_templates_build_with_one_request_and_do_their_jobs() {
    if skip_unless_root() {
        return;
    }
    let d = super::daemon::Daemon::start(&[]);
    if !debian_base(d.home()) {
        return;
    }
    let built = |name: &str, extra: serde_json::Value| {
        let mut body = json!({"name": name, "builtin": name, "wait": true});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = d.post("/v1/templates", body);
        assert_eq!(r.status, 200, "{}", r.body);
        let log = d.get(&format!(
            "/v1/builds/{}/logs?format=json",
            r.body["id"].as_str().unwrap()
        ));
        assert_eq!(r.body["state"], "succeeded", "{}\n{}", r.body, log.body);
        r.body
    };

    // python-data-analysis: its sandboxes start with the python kernel, without network, and a
    // figure written to the outputs folder comes back as an artifact.
    let info = built("python-data-analysis", json!({}));
    assert!(
        info["image"]["kernels"]
            .as_array()
            .unwrap()
            .contains(&json!("python")),
        "{info}"
    );
    // Its template file asks for a warm pool of one sandbox that has imported pandas: the
    // daemon fills it once the build is done, and the create takes it.
    let metrics = || {
        let r = super::daemon::send(d.req(reqwest::Method::GET, "/metrics"));
        r.body.as_str().unwrap_or_default().to_string()
    };
    super::daemon::wait_for(std::time::Duration::from_secs(120), || {
        metrics()
            .contains("sandcell_pool_ready{pool=\"python-data-analysis:latest/template\"} 1")
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the template's pool never filled: {}\n{}",
            metrics(),
            d.log()
        )
    });
    let sb = d.create_id(json!({"template": "python-data-analysis"}));
    assert!(
        metrics().contains("sandcell_pool_requests_total{result=\"hit\"} 1"),
        "{}",
        metrics()
    );
    let warmed = d.code(&sb, "import sys\nprint('pandas' in sys.modules)");
    assert_eq!(warmed.stdout, "True\n", "the warm-up ran: {warmed:?}");
    let out = d.code(
        &sb,
        "import pandas as pd, numpy as np, matplotlib.pyplot as plt\n\
         df = pd.DataFrame({'x': np.arange(10), 'y': np.arange(10) ** 2})\n\
         df.plot(x='x', y='y')\n\
         plt.savefig('/workspace/outputs/squares.png')\n\
         print(int(df.y.sum()))",
    );
    assert_eq!(out.error, None, "{out:?}");
    assert!(out.stdout.contains("285"), "{out:?}");
    let artifacts = d.get(&format!("/v1/sandboxes/{sb}/artifacts"));
    assert!(
        artifacts.body.to_string().contains("squares.png")
            && artifacts.body.to_string().contains("image/png"),
        "{}",
        artifacts.body
    );
    assert_eq!(
        d.sandbox(&sb).network,
        sandcell_api::network::NetworkPolicy::Off
    );
    assert_eq!(d.delete(&format!("/v1/sandboxes/{sb}")).status, 204);

    // cpp-algorithm: cpp-run compiles and runs, and reports both phases with their timings.
    built("cpp-algorithm", json!({}));
    let sb = d.create_id(json!({"template": "cpp-algorithm"}));
    let out = d.exec(
        &sb,
        "cat > /workspace/sum.cpp <<'EOF'\n\
         #include <cstdio>\n\
         int main() { long s = 0; for (int i = 1; i <= 1000; i++) s += i; std::printf(\"%ld\\n\", s); }\n\
         EOF\n\
         cpp-run /workspace/sum.cpp",
    );
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "500500\n");
    let report: serde_json::Value = serde_json::from_str(out.stderr.trim()).unwrap();
    assert_eq!(report["phase"], "run");
    assert!(report["compile_ms"].as_u64().unwrap() > 0, "{report}");
    assert!(report["run_ms"].is_u64(), "{report}");
    let out = d.exec(
        &sb,
        "echo 'int main( {' > /workspace/bad.cpp; cpp-run /workspace/bad.cpp",
    );
    assert_ne!(out.exit_code, Some(0));
    assert!(
        out.stderr.contains("\"phase\":\"compile\""),
        "{}",
        out.stderr
    );
    assert_eq!(d.delete(&format!("/v1/sandboxes/{sb}")).status, 204);

    // web-tools reaches only the hosts its builder allows: none given is refused at once.
    let r = d.post(
        "/v1/templates",
        json!({"name": "web-tools", "builtin": "web-tools"}),
    );
    r.expect_error(400, "invalid_argument");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("sandbox_network"),
        "{}",
        r.body
    );
}

/// A daemon whose store holds template `name`, built over REST from the busybox image (one
/// step: `/etc/built`) with the template file's `sections`; `None` when skipped.
fn daemon_with_template(
    name: &str,
    sections: &str,
) -> Option<(tempfile::TempDir, super::daemon::Daemon)> {
    let tmp = tempfile::tempdir().unwrap();
    let d = super::daemon::Daemon::start(&[]);
    if !import_tiny(tmp.path(), d.home(), TOOLS) {
        return None;
    }
    let spec = format!(
        "name = \"{name}\"\ndockerfile_inline = \"FROM tiny:v1\\nRUN echo built > /etc/built\\n\"\n{sections}"
    );
    let r = d.post(
        "/v1/templates",
        json!({"name": name, "spec": spec, "wait": true}),
    );
    assert_eq!(r.body["state"], "succeeded", "{}", r.body);
    Some((tmp, d))
}

#[test]
fn a_singleton_template_gives_each_owner_one_sandbox_that_every_create_shares() {
    if skip_unless_root() {
        return;
    }
    let Some((_tmp, d)) = daemon_with_template("shared", "[warm]\nstrategy = \"singleton\"\n")
    else {
        return;
    };

    let first = d.create_id(json!({"template": "shared"}));
    assert!(d.exec(&first, "echo mine > /workspace/note").ok);
    // Every create of the owner gets that sandbox, with what it holds.
    let again = d.create_id(json!({"template": "shared"}));
    assert_eq!(again, first);
    assert_eq!(d.exec(&again, "cat /workspace/note").stdout, "mine\n");
    // Another owner gets one of its own.
    let (bobs_key, _) = d.key_for("bob");
    let bobs = d.create_as(&bobs_key, json!({"template": "shared"}));
    assert_ne!(bobs.id, first);
    // Once it is gone, the next create makes the next one.
    assert_eq!(d.delete(&format!("/v1/sandboxes/{first}")).status, 204);
    let next = d.create_id(json!({"template": "shared"}));
    assert_ne!(next, first);
    assert_eq!(d.exec(&next, "cat /etc/built").stdout, "built\n");
}

#[test]
fn a_snapshot_template_on_gvisor_keeps_a_seed_and_restores_its_pool_from_it() {
    if skip_unless_root() {
        return;
    }
    let Some((_tmp, d)) = daemon_with_template(
        "seeded",
        "[sandbox]\nbackend = \"gvisor\"\n[warm]\nstrategy = \"snapshot\"\nsize = 1\n",
    ) else {
        return;
    };
    let metrics = || {
        let r = super::daemon::send(d.req_as(Some(&d.key), reqwest::Method::GET, "/metrics"));
        r.body.as_str().unwrap_or_default().to_string()
    };
    let ready = |n: u32| {
        let line = format!("sandcell_pool_ready{{pool=\"seeded:latest/template\"}} {n}");
        super::daemon::wait_for(std::time::Duration::from_secs(60), || {
            metrics().contains(&line).then_some(())
        })
        .unwrap_or_else(|| panic!("never {line}: {}\n{}", metrics(), d.log()));
    };
    ready(1);
    let seed = d.home().join("pool-seeds/seeded:latest");
    assert!(
        std::fs::read_dir(&seed).is_ok_and(|mut e| e.next().is_some()),
        "the seed snapshot is kept in {}",
        seed.display()
    );
    // A create naming the template takes the seeded sandbox, on the template's backend.
    let r = d.post("/v1/sandboxes", json!({"template": "seeded"}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["backend"], "gvisor", "{}", r.body);
    assert!(
        metrics().contains("sandcell_pool_requests_total{result=\"hit\"} 1"),
        "{}",
        metrics()
    );
    let first = r.body["id"].as_str().unwrap().to_string();
    assert_eq!(d.exec(&first, "cat /etc/built").stdout, "built\n");
    // The next is restored from the seed: a sandbox of its own.
    ready(1);
    let r = d.post("/v1/sandboxes", json!({"template": "seeded"}));
    assert_eq!(r.status, 201, "{}", r.body);
    let second = r.body["id"].as_str().unwrap().to_string();
    assert_ne!(second, first);
    assert!(
        metrics().contains("sandcell_pool_requests_total{result=\"hit\"} 2"),
        "{}",
        metrics()
    );
    assert_eq!(d.exec(&second, "hostname").stdout.trim(), second);
    assert!(d.exec(&second, "echo only-here > /workspace/x").ok);
    assert!(!d.exec(&first, "cat /workspace/x").ok, "nothing shared");
    // Deleting the template (its sandboxes gone) removes its pool and its seed.
    for id in [&first, &second] {
        assert_eq!(d.delete(&format!("/v1/sandboxes/{id}")).status, 204);
    }
    assert_eq!(d.delete("/v1/templates/seeded").status, 204);
    assert!(!seed.exists(), "the seed is removed with its template");
    assert!(
        !metrics().contains("seeded:latest/template"),
        "{}",
        metrics()
    );
}

#[test]
fn the_mounted_root_of_an_image_that_is_gone_is_detached_when_the_next_image_mounts() {
    if skip_unless_root() {
        return;
    }
    let mounts_of = |path: &Path| {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let needle = format!(" {}", path.display());
        info.lines()
            .filter(|l| l.contains(&needle) && l.contains("/rootfs/root-"))
            .count()
    };
    let first = tempfile::tempdir().unwrap();
    let home = first.path().join("home");
    if !import_tiny(first.path(), &home, TOOLS) {
        return;
    }
    assert_eq!(run_on(&home, "tiny:v1", "echo one"), "one\n");
    let images = home.join("images");
    assert!(mounts_of(&images) > 0, "its skeleton is mounted ahead");
    // The store goes without a prune (a deleted temporary home): its skeleton's binds now
    // pin deleted folders.
    drop(first);
    let second = tempfile::tempdir().unwrap();
    let other = second.path().join("home");
    assert!(import_tiny(second.path(), &other, TOOLS));
    assert_eq!(run_on(&other, "tiny:v1", "echo two"), "two\n");
    assert_eq!(
        mounts_of(&images),
        0,
        "the gone image's skeleton is detached"
    );
    assert!(mounts_of(&other.join("images")) > 0);
}
