//! State capture (`dump_state` / `load_state`): a session's variables written by one kernel
//! and restored into a fresh one, over the protocol.

use sandcell_protocol::Language::{self, Bash, Node, Python, R};
use serde_json::{Value, json};

use crate::common::*;

/// Runs a cell that must succeed.
fn ok(k: &mut Kernel, code: &str) -> Vec<Value> {
    let ev = k.execute(code);
    assert_eq!(done(&ev)["status"], "ok", "{code}: {ev:?}");
    ev
}

/// The text of a cell's result.
fn value(k: &mut Kernel, code: &str) -> String {
    let ev = ok(k, code);
    result_text(&ev).unwrap_or_else(|| panic!("{code}: no result in {ev:?}"))
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect()
}

/// The `skipped` entry of `name`, if any.
fn skipped<'a>(report: &'a Value, name: &str) -> Option<&'a Value> {
    report["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
}

#[test]
fn python_state_round_trips_into_a_fresh_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.txt");
    std::fs::write(&data, "contents").unwrap();
    let path = dir.path().join("state/python.pkl");
    let mut k = Kernel::start(Python);
    ok(
        &mut k,
        &format!(
            r#"
import json as j
import os.path
counter = 10
def add(x):
    return x + counter
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return self.x ** 2 + self.y ** 2
class Point3(Point):
    def __init__(self, x, y, z):
        super().__init__(x, y)
        self.z = z
p = Point(3, 4)
q = Point3(1, 2, 3)
sq = lambda v: v * v
nested = {{"a": [1, 2.5, None], "t": (1, "two"), "s": {{3, 4}}, "b": b"\x00\xff"}}
_private = "kept"
fh = open({data:?})
gen = (i for i in range(3))
"#
        ),
    );
    // A value the user left as the last result is not a variable.
    value(&mut k, "1 + 1");
    let report = k.call(json!({"op": "dump_state", "path": path}));
    assert!(report.get("error").is_none(), "{report}");
    let saved = names(&report["saved"]);
    for name in [
        "j", "os", "counter", "add", "Point", "Point3", "p", "q", "sq", "nested", "_private",
    ] {
        assert!(saved.contains(&name.to_string()), "{name} not in {saved:?}");
    }
    assert!(!saved.contains(&"_".to_string()), "{saved:?}");
    // A file open for reading is not copied as its contents: it is left out, and says why.
    let fh = skipped(&report, "fh").expect("fh skipped");
    assert_eq!(fh["type"], "TextIOWrapper");
    assert!(fh["reason"].as_str().unwrap().contains("open file"), "{fh}");
    let gen_ = skipped(&report, "gen").expect("gen skipped");
    assert!(
        gen_["reason"].as_str().unwrap().contains("generator"),
        "{gen_}"
    );
    assert_eq!(
        report["bytes"].as_u64().unwrap(),
        std::fs::metadata(&path).unwrap().len()
    );
    drop(k);

    let mut k = Kernel::start(Python);
    let loaded = k.call(json!({"op": "load_state", "path": path}));
    assert_eq!(loaded["failed"], json!([]), "{loaded}");
    assert_eq!(names(&loaded["restored"]), saved);
    assert_eq!(value(&mut k, "add(1)"), "11");
    // The restored function reads the kernel's globals, not a copy taken at the dump.
    ok(&mut k, "counter = 100");
    assert_eq!(value(&mut k, "add(1)"), "101");
    assert_eq!(
        value(
            &mut k,
            "(type(p) is Point, isinstance(q, Point), type(q) is Point3, q.norm2(), q.z)"
        ),
        "(True, True, True, 5, 3)"
    );
    assert_eq!(
        value(&mut k, "(Point.__module__, Point3.__module__)"),
        "('__main__', '__main__')"
    );
    assert_eq!(value(&mut k, "Point(6, 8).norm2()"), "100");
    assert_eq!(value(&mut k, "sq(9)"), "81");
    assert_eq!(
        value(&mut k, "nested"),
        "{'a': [1, 2.5, None], 't': (1, 'two'), 's': {3, 4}, 'b': b'\\x00\\xff'}"
    );
    assert_eq!(value(&mut k, "j.dumps([1])"), "'[1]'");
    assert_eq!(value(&mut k, "os.path.join('a', 'b')"), "'a/b'");
    assert_eq!(value(&mut k, "_private"), "'kept'");
    assert_eq!(value(&mut k, "'fh' in globals()"), "False");
    // A restored kernel's state can be captured again.
    let again = k.call(json!({"op": "dump_state", "path": dir.path().join("again.pkl")}));
    assert!(
        names(&again["saved"]).contains(&"Point3".to_string()),
        "{again}"
    );
}

#[test]
fn python_restore_reports_what_cannot_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("lib");
    std::fs::create_dir(&lib).unwrap();
    std::fs::write(lib.join("sandcell_gone_mod.py"), "X = 5\n").unwrap();
    let path = dir.path().join("s.pkl");
    let mut k = Kernel::start(Python);
    ok(
        &mut k,
        &format!(
            "import sys\nsys.path.insert(0, {:?})\nimport sandcell_gone_mod as gm\nkept = gm.X\nshow = display",
            lib.display().to_string()
        ),
    );
    let report = k.call(json!({"op": "dump_state", "path": path}));
    assert!(
        names(&report["saved"]).contains(&"gm".to_string()),
        "{report}"
    );
    drop(k);
    std::fs::remove_dir_all(&lib).unwrap();

    let mut k = Kernel::start(Python);
    let loaded = k.call(json!({"op": "load_state", "path": path}));
    let failed = loaded["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{loaded}");
    assert_eq!(failed[0]["name"], "gm");
    assert!(
        failed[0]["reason"]
            .as_str()
            .unwrap()
            .contains("ModuleNotFoundError"),
        "{loaded}"
    );
    assert!(names(&loaded["restored"]).contains(&"kept".to_string()));
    assert_eq!(value(&mut k, "kept"), "5");
    // The kernel's own `display` is carried by name, not copied with the kernel's state.
    assert_eq!(value(&mut k, "show is display"), "True");

    // Not a state file, and a relative path: errors, and the kernel goes on.
    std::fs::write(dir.path().join("junk"), "junk").unwrap();
    let bad = k.call(json!({"op": "load_state", "path": dir.path().join("junk")}));
    assert!(
        bad["error"]
            .as_str()
            .unwrap()
            .contains("not a python state file"),
        "{bad}"
    );
    let bad = k.call(json!({"op": "dump_state", "path": "relative.pkl"}));
    assert!(bad["error"].as_str().unwrap().contains("absolute"), "{bad}");
    assert_eq!(value(&mut k, "kept + 1"), "6");
}

#[test]
fn python_long_lists_round_trip_and_keep_what_they_share() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.txt");
    std::fs::write(&data, "contents").unwrap();
    let path = dir.path().join("long.pkl");
    let mut k = Kernel::start(Python);
    ok(
        &mut k,
        &format!(
            r#"
rows = [str(i) * 3 for i in range(5000)]
mixed = tuple(
    [str(i) for i in range(3000)]
    + [i + 0.5 for i in range(2)]
    + [str(i).encode() * 2 for i in range(2)]
    + ["é" * (i + 3) for i in range(1)]
)
few = [None, True, 7, 1.5, "a"] * 300
big = "x" * 1000
twice = [big] * 2000
kept = [str(i) for i in range(2000)]
alias = kept[10]
broken = [1, 2, open({data:?})]
after = 7
"#
        ),
    );
    let report = k.call(json!({"op": "dump_state", "path": path}));
    assert!(report.get("error").is_none(), "{report}");
    // A value that fails half-way leaves nothing of it in the file: the next one reads back.
    assert!(skipped(&report, "broken").is_some(), "{report}");
    let size = std::fs::metadata(&path).unwrap().len();
    assert_eq!(report["bytes"].as_u64().unwrap(), size);
    // `twice` holds one string 2000 times: written once, not 2000 times (2 MB).
    assert!(size < 200_000, "{size} bytes: {report}");
    drop(k);

    let mut k = Kernel::start(Python);
    let loaded = k.call(json!({"op": "load_state", "path": path}));
    assert_eq!(loaded["failed"], json!([]), "{loaded}");
    assert_eq!(
        value(
            &mut k,
            "(len(rows), rows[0], rows[-1], type(rows).__name__)"
        ),
        "(5000, '000', '499949994999', 'list')"
    );
    assert_eq!(
        value(
            &mut k,
            "(type(mixed).__name__, len(mixed), mixed[2999], mixed[3000:])"
        ),
        "('tuple', 3005, '2999', (0.5, 1.5, b'00', b'11', 'ééé'))"
    );
    assert_eq!(
        value(&mut k, "(len(few), few[-5:])"),
        "(1500, [None, True, 7, 1.5, 'a'])"
    );
    assert_eq!(
        value(
            &mut k,
            "(len(twice), twice[0] is twice[1999], twice[0] == big)"
        ),
        "(2000, True, True)"
    );
    assert_eq!(value(&mut k, "(kept[10], alias)"), "('10', '10')");
    assert_eq!(
        value(&mut k, "(after, 'broken' in globals())"),
        "(7, False)"
    );
}

#[test]
fn python_state_files_of_earlier_kernels_still_load() {
    // As kernels wrote them before the pickle went straight into the file: the header's
    // size unpadded, the pickle (protocol 2 here, `[1, 'a']`) after it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.pkl");
    let pickle: &[u8] = b"\x80\x02]q\x00(K\x01X\x01\x00\x00\x00aq\x01e.";
    let header = format!(
        r#"{{"name": "old", "kind": "pickle", "size": {}}}"#,
        pickle.len()
    );
    let module = r#"{"name": "m", "kind": "module", "module": "json"}"#;
    let mut file = b"sandcell-python-state 1\n".to_vec();
    for (head, body) in [(module, &b""[..]), (header.as_str(), pickle)] {
        file.extend_from_slice(&(head.len() as u64).to_be_bytes());
        file.extend_from_slice(head.as_bytes());
        file.extend_from_slice(body);
    }
    std::fs::write(&path, file).unwrap();
    let mut k = Kernel::start(Python);
    let loaded = k.call(json!({"op": "load_state", "path": path}));
    assert_eq!(loaded["failed"], json!([]), "{loaded}");
    assert_eq!(names(&loaded["restored"]), ["m", "old"]);
    assert_eq!(
        value(&mut k, "(old, m.dumps(old))"),
        r#"([1, 'a'], '[1, "a"]')"#
    );
}

#[test]
fn node_state_round_trips_into_a_fresh_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state/node.bin");
    let mut k = Kernel::start(Node);
    ok(
        &mut k,
        r#"
const n = 42, s = 'hi', big = 2n ** 70n;
let o = {a: [1, 2, {b: null}], nested: {deep: true}};
const m = new Map([['k', {v: 1}], [2, new Set(['x'])]]);
const when = new Date(1700000000000);
const re = /ab+c/gi;
const buf = Buffer.from('abc');
const u8 = new Uint8Array([1, 2, 3]);
const bare = Object.create(null); bare.z = 1;
function add(a, b) { return a + b + n; }
const sq = (x) => x * x;
class Point { constructor(x, y) { this.x = x; this.y = y; } norm2() { return this.x ** 2 + this.y ** 2; } }
class Point3 extends Point { constructor(x, y, z) { super(x, y); this.z = z; } }
const p = new Point3(1, 2, 3);
const pts = [new Point(1, 1), p];
const plus = add;
const path = require('path');
const withFn = {f() { return 1; }};
const timer = setTimeout(() => {}, 100000); clearTimeout(timer);
const builtin = Math.max;
const method = ({m() { return 2; }}).m;
"#,
    );
    let report = k.call(json!({"op": "dump_state", "path": path}));
    assert!(report.get("error").is_none(), "{report}");
    let saved = names(&report["saved"]);
    for name in [
        "n", "s", "big", "o", "m", "when", "re", "buf", "u8", "bare", "add", "sq", "Point",
        "Point3", "p", "pts", "plus", "path",
    ] {
        assert!(saved.contains(&name.to_string()), "{name} not in {saved:?}");
    }
    let why = |name: &str| {
        skipped(&report, name).unwrap_or_else(|| panic!("{name} not skipped: {report}"))["reason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(why("withFn").contains("could not be cloned"), "{report}");
    assert!(why("timer").contains("Timeout"), "{report}");
    assert!(why("builtin").contains("built-in"), "{report}");
    assert!(
        why("method").contains("not a function expression"),
        "{report}"
    );
    assert_eq!(skipped(&report, "withFn").unwrap()["type"], "Object");
    drop(k);

    let mut k = Kernel::start(Node);
    let loaded = k.call(json!({"op": "load_state", "path": path}));
    assert_eq!(loaded["failed"], json!([]), "{loaded}");
    let mut restored = names(&loaded["restored"]);
    let mut expected = saved.clone();
    restored.sort();
    expected.sort();
    assert_eq!(restored, expected);
    let checks = [
        ("[n, s, big]", "[ 42, 'hi', 1180591620717411303424n ]"),
        ("o", "{ a: [ 1, 2, { b: null } ], nested: { deep: true } }"),
        ("o instanceof Object && o.a instanceof Array", "true"),
        (
            "m instanceof Map && m.get(2) instanceof Set && m.get('k').v",
            "1",
        ),
        ("when instanceof Date && when.getTime()", "1700000000000"),
        (
            "re instanceof RegExp && re.test('xabbc') && re.flags",
            "'gi'",
        ),
        ("Buffer.isBuffer(buf) && buf.toString()", "'abc'"),
        ("u8 instanceof Uint8Array && u8.join()", "'1,2,3'"),
        ("Object.getPrototypeOf(bare) === null && bare.z", "1"),
        ("add(1, 2)", "45"),
        ("sq(5)", "25"),
        ("plus === add", "true"),
        (
            "p instanceof Point3 && p instanceof Point && p.norm2() + p.z",
            "8",
        ),
        (
            "pts[0] instanceof Point && pts[1] instanceof Point3",
            "true",
        ),
        ("new Point3(3, 4, 0).norm2()", "25"),
        ("path.join('a', 'b')", "'a/b'"),
        ("typeof withFn", "'undefined'"),
    ];
    for (code, want) in checks {
        assert_eq!(value(&mut k, code), want, "{code}");
    }
}

#[test]
fn node_restore_errors_are_replies() {
    let dir = tempfile::tempdir().unwrap();
    let mut k = Kernel::start(Node);
    let missing = k.call(json!({"op": "load_state", "path": dir.path().join("nope")}));
    assert!(
        missing["error"].as_str().unwrap().contains("cannot read"),
        "{missing}"
    );
    std::fs::write(dir.path().join("junk"), "junk").unwrap();
    let bad = k.call(json!({"op": "load_state", "path": dir.path().join("junk")}));
    assert!(bad["error"].is_string(), "{bad}");
    let rel = k.call(json!({"op": "dump_state", "path": "x.bin"}));
    assert!(rel["error"].as_str().unwrap().contains("absolute"), "{rel}");
    assert_eq!(value(&mut k, "1 + 1"), "2");
}

fn unsupported(lang: Language) {
    let mut k = Kernel::start(lang);
    for op in ["dump_state", "load_state"] {
        let reply = k.call(json!({"op": op, "path": "/tmp/x"}));
        assert_eq!(
            reply["error"],
            format!("state capture is not supported for {lang}"),
            "{reply}"
        );
    }
}

#[test]
fn bash_state_capture_is_not_supported() {
    unsupported(Bash);
}

#[test]
fn r_state_capture_is_not_supported() {
    unsupported(R);
}
