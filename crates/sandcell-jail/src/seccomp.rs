//! The seccomp filter installed last, just before the guest agent takes over.
//!
//! Default allow, with kernel-attack-surface and escape-helper syscalls refused. One classic
//! BPF program, generated here rather than by a general filter compiler, because start-up
//! pays for every instruction the kernel checks and JIT-compiles, and every syscall inside the
//! sandbox runs the program:
//! - a foreign architecture (e.g. i386 `int 0x80` syscalls, whose numbers differ) kills the
//!   process; on x86_64, x32-ABI numbers get `EPERM`: both would otherwise slip past the rules,
//!   which match exact native numbers;
//! - the deny-list proper: `EPERM`, including conditional rules (new user namespaces through
//!   `clone`/`unshare`, unusual `personality` values, `TIOCSTI`/`TIOCLINUX` ioctls);
//! - `clone3` -> `ENOSYS`: its flags live in a struct a filter cannot read, and glibc falls back
//!   to `clone` (which we can inspect) on `ENOSYS` but not on `EPERM`;
//! - socket families -> `EAFNOSUPPORT`, which programs treat as "no such network".
//!
//! The `gvisor` backend's agent installs the same program inside gVisor ([`Profile::Gvisor`]),
//! with one addition: device nodes, which gVisor's kernel lets any user make.
//!
//! Syscall numbers are found by a binary search over the sorted rules, so an allowed syscall
//! costs about a dozen instructions.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use sandcell_protocol::isolation::{Feature, FeatureState};

use crate::config::NetworkMode;
use crate::error::JailError;

/// Syscalls refused outright, with their numbers on this architecture.
const DENIED: &[(&str, libc::c_long)] = &[
    // Inspecting or changing other processes.
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    // Mounts and the filesystem view.
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("setns", libc::SYS_setns),
    // The kernel itself: modules, kexec, eBPF, perf, keyrings, io_uring, userfaultfd.
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    // Host administration.
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("quotactl_fd", libc::SYS_quotactl_fd),
    ("syslog", libc::SYS_syslog),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("vhangup", libc::SYS_vhangup),
    #[cfg(target_arch = "x86_64")]
    ("iopl", libc::SYS_iopl),
    #[cfg(target_arch = "x86_64")]
    ("ioperm", libc::SYS_ioperm),
    #[cfg(target_arch = "x86_64")]
    ("uselib", libc::SYS_uselib),
];

/// `personality` values left allowed (the query, plain Linux, 32-bit and uname26 personas,
/// as Docker allows); others can turn off ASLR or make data executable.
const ALLOWED_PERSONAS: &[u32] = &[0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

/// `ioctl` requests from asm-generic/ioctls.h (the same on x86_64 and aarch64).
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;

/// Bit set in the syscall number of x32-ABI calls on x86_64 (`__X32_SYSCALL_BIT`).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Names of the syscalls refused outright with `EPERM` (conditional rules are in
/// [`install`]'s detail).
pub fn denied_syscalls() -> &'static [&'static str] {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| DENIED.iter().map(|(name, _)| *name).collect())
}

/// A compiled seccomp program, ready for [`apply_filter`].
#[derive(Debug, Clone)]
pub struct SeccompProgram(Vec<libc::sock_filter>);

impl SeccompProgram {
    /// Number of BPF instructions.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the program is empty (never, for a built one).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What the program decides for a syscall, computed by a small classic-BPF interpreter
    /// (for tests and for `doctor`-style explanations; the kernel runs the real thing).
    pub fn decide(&self, arch: u32, nr: u32, args: [u64; 6]) -> Decision {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let word = |off: u32| -> u32 {
            let o = off as usize;
            data.get(o..o + 4)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u32::from_ne_bytes)
        };
        let (mut acc, mut pc) = (0u32, 0usize);
        while let Some(insn) = self.0.get(pc) {
            let (jt, jf) = (usize::from(insn.jt), usize::from(insn.jf));
            pc += 1;
            match insn.code {
                LD_W_ABS => acc = word(insn.k),
                JEQ_K => pc += if acc == insn.k { jt } else { jf },
                JGE_K => pc += if acc >= insn.k { jt } else { jf },
                JSET_K => pc += if acc & insn.k != 0 { jt } else { jf },
                RET_K => return Decision::from_ret(insn.k),
                _ => return Decision::Kill,
            }
        }
        Decision::Kill
    }
}

/// The outcome of a syscall under the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The syscall runs.
    Allow,
    /// The syscall fails with this errno.
    Errno(i32),
    /// The process is killed.
    Kill,
}

impl Decision {
    fn from_ret(k: u32) -> Self {
        match k & SECCOMP_RET_ACTION_FULL {
            SECCOMP_RET_ALLOW => Decision::Allow,
            SECCOMP_RET_ERRNO => Decision::Errno((k & SECCOMP_RET_DATA) as i32),
            _ => Decision::Kill,
        }
    }

    fn ret(self) -> u32 {
        match self {
            Decision::Allow => SECCOMP_RET_ALLOW,
            Decision::Errno(e) => SECCOMP_RET_ERRNO | (e.unsigned_abs() & SECCOMP_RET_DATA),
            Decision::Kill => SECCOMP_RET_KILL_PROCESS,
        }
    }
}

/// The `AUDIT_ARCH_*` value of the architecture this binary was built for.
pub fn native_arch() -> Result<u32, JailError> {
    // EM_* | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE (linux/audit.h).
    const ARCH_64_LE: u32 = 0x8000_0000 | 0x4000_0000;
    match std::env::consts::ARCH {
        "x86_64" => Ok(62 | ARCH_64_LE),
        "aarch64" => Ok(183 | ARCH_64_LE),
        other => Err(JailError::Seccomp(format!(
            "unsupported architecture: {other}"
        ))),
    }
}

/// Which kernel a filter is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profile {
    /// The host kernel (`process` backend): the deny-list alone.
    #[default]
    Process,
    /// gVisor's kernel (`gvisor` backend): the deny-list, plus what the host kernel refuses
    /// a process without capabilities and gVisor's does not: `clone`/`unshare` with any
    /// namespace flag (gVisor makes mount, UTS, IPC, … namespaces for anyone) and
    /// `mknod`/`mknodat` of character and block devices -> `EPERM`.
    Gvisor,
}

/// Compiles the filter for `network`; apply it with [`apply_filter`].
pub fn build_filter(network: NetworkMode) -> Result<SeccompProgram, JailError> {
    build_profile(network, Profile::Process)
}

/// Compiles the filter of `profile` for `network`.
pub fn build_profile(network: NetworkMode, profile: Profile) -> Result<SeccompProgram, JailError> {
    let arch = native_arch()?;
    let mut rules: BTreeMap<u32, Rule> = BTreeMap::new();
    for &(_, nr) in DENIED {
        rules.insert(syscall_nr(nr)?, Rule::Errno(libc::EPERM));
    }
    // New user namespaces are the door to the kernel's namespaced-root attack surface; other
    // namespace flags need capabilities the sandbox no longer has.
    let (clone_ns, unshare_ns) = match profile {
        Profile::Process => {
            let newuser = libc::CLONE_NEWUSER.unsigned_abs();
            (newuser, newuser)
        }
        // CLONE_NEWTIME (0x80) is an exit-signal bit to clone, a namespace only to unshare.
        Profile::Gvisor => (NAMESPACE_FLAGS, NAMESPACE_FLAGS | CLONE_NEWTIME),
    };
    rules.insert(syscall_nr(libc::SYS_clone)?, Rule::FlagSet(0, clone_ns));
    rules.insert(syscall_nr(libc::SYS_unshare)?, Rule::FlagSet(0, unshare_ns));
    rules.insert(syscall_nr(libc::SYS_clone3)?, Rule::Errno(libc::ENOSYS));
    rules.insert(
        syscall_nr(libc::SYS_personality)?,
        Rule::OnlyValues(0, ALLOWED_PERSONAS),
    );
    // TIOCSTI fakes terminal input for whoever owns the terminal; TIOCLINUX reaches the console.
    rules.insert(
        syscall_nr(libc::SYS_ioctl)?,
        Rule::NotValues(1, &[TIOCSTI, TIOCLINUX]),
    );
    rules.insert(syscall_nr(libc::SYS_socket)?, Rule::Socket(network));
    if profile == Profile::Gvisor {
        #[cfg(target_arch = "x86_64")]
        rules.insert(syscall_nr(libc::SYS_mknod)?, Rule::DeviceNode(1));
        rules.insert(syscall_nr(libc::SYS_mknodat)?, Rule::DeviceNode(2));
    }

    let mut asm = Asm::default();
    let (kill, eperm, allow) = (asm.label(), asm.label(), asm.label());
    asm.load(ARCH_OFFSET);
    asm.jump(JEQ_K, arch, Next, To(kill));
    asm.load(NR_OFFSET);
    if cfg!(target_arch = "x86_64") {
        asm.jump(JGE_K, X32_SYSCALL_BIT, To(eperm), Next);
    }
    let entries: Vec<(u32, Rule)> = rules.into_iter().collect();
    let mut blocks = Vec::new();
    search(&mut asm, &entries, eperm, allow, &mut blocks);
    for (label, rule) in blocks {
        asm.bind(label);
        rule.emit(&mut asm, eperm, allow);
    }
    asm.bind(kill);
    asm.ret(Decision::Kill);
    asm.bind(eperm);
    asm.ret(Decision::Errno(libc::EPERM));
    asm.bind(allow);
    asm.ret(Decision::Allow);
    asm.finish()
}

/// Loads `program` into the calling thread (and so into every process it later starts).
///
/// Allocates nothing, so it is safe in a child forked from a threaded process. The caller
/// must have set `no_new_privs` (the kernel requires it without `CAP_SYS_ADMIN`).
pub fn apply_filter(program: &SeccompProgram) -> Result<(), JailError> {
    let len = u16::try_from(program.0.len())
        .map_err(|_| JailError::Seccomp("the filter is too long".into()))?;
    let prog = libc::sock_fprog {
        len,
        filter: program.0.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `len` initialized instructions that outlive the call; the
    // kernel copies the program and does not keep the pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    };
    if r != 0 {
        return Err(JailError::Seccomp(format!(
            "load the filter: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Builds and loads the filter for `network`, reporting what is refused.
pub fn install(network: NetworkMode) -> Result<Feature, JailError> {
    let program = build_filter(network)?;
    apply_filter(&program)?;
    Ok(feature(network))
}

/// The report line for a filter built for `network` and applied.
pub fn feature(network: NetworkMode) -> Feature {
    feature_of(network, Profile::Process)
}

/// The report line for a filter of `profile` built for `network` and applied.
pub fn feature_of(network: NetworkMode, profile: Profile) -> Feature {
    let mut detail = describe(network);
    if profile == Profile::Gvisor {
        detail.push_str(
            "; clone/unshare with any namespace flag and mknod of character and block \
             devices -> EPERM",
        );
    }
    Feature {
        name: "seccomp".into(),
        state: FeatureState::Active,
        detail,
    }
}

/// One line saying what the filter for `network` refuses.
fn describe(network: NetworkMode) -> String {
    let sockets = match network {
        NetworkMode::Off => "unix only",
        NetworkMode::Loopback => {
            "unix, inet, inet6, netlink route and sock_diag (loopback namespace)"
        }
    };
    let x32 = if cfg!(target_arch = "x86_64") {
        "; x32 syscalls -> EPERM"
    } else {
        ""
    };
    format!(
        "deny-list: {} syscalls -> EPERM, plus clone/unshare with CLONE_NEWUSER, unusual \
         personality values and TIOCSTI/TIOCLINUX ioctls -> EPERM; clone3 -> ENOSYS; \
         sockets: {sockets}, other families -> EAFNOSUPPORT{x32}",
        DENIED.len()
    )
}

// Classic BPF opcodes (linux/bpf_common.h), seccomp return values and the seccomp_data
// layout (linux/seccomp.h).
const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;
const ARGS_OFFSET: u32 = 16;
const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ACTION_FULL: u32 = 0xffff_0000;
const SECCOMP_RET_DATA: u32 = 0x0000_ffff;

/// Entries searched linearly once a binary-search range is this small.
const LEAF: usize = 4;

fn syscall_nr(nr: libc::c_long) -> Result<u32, JailError> {
    u32::try_from(nr).map_err(|_| JailError::Seccomp(format!("bad syscall number {nr}")))
}

/// What happens to one syscall.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// Always fails with this errno.
    Errno(i32),
    /// `EPERM` when argument `.0` has any of the bits `.1`.
    FlagSet(u32, u32),
    /// `EPERM` unless argument `.0` is one of the values.
    OnlyValues(u32, &'static [u32]),
    /// `EPERM` when argument `.0` is one of the values.
    NotValues(u32, &'static [u32]),
    /// `socket`: families (and netlink protocols) by network mode.
    Socket(NetworkMode),
    /// `EPERM` when the file type in argument `.0` (a mode) is a character or block device.
    DeviceNode(u32),
}

impl Rule {
    /// Emits the rule's checks; every path ends in a return or a jump to `eperm`/`allow`.
    /// Arguments are compared on their low 32 bits: the kernel reads these ones as `int`.
    fn emit(self, asm: &mut Asm, eperm: Label, allow: Label) {
        match self {
            Rule::Errno(e) => asm.ret(Decision::Errno(e)),
            Rule::FlagSet(arg, bits) => {
                asm.load(arg_offset(arg));
                asm.jump(JSET_K, bits, To(eperm), To(allow));
            }
            Rule::OnlyValues(arg, values) => {
                asm.load(arg_offset(arg));
                for &v in values {
                    asm.jump(JEQ_K, v, To(allow), Next);
                }
                asm.ret(Decision::Errno(libc::EPERM));
            }
            Rule::NotValues(arg, values) => {
                asm.load(arg_offset(arg));
                for &v in values {
                    asm.jump(JEQ_K, v, To(eperm), Next);
                }
                asm.ret(Decision::Allow);
            }
            Rule::Socket(network) => {
                let refuse = Decision::Errno(libc::EAFNOSUPPORT);
                asm.load(arg_offset(0));
                asm.jump(JEQ_K, af(libc::AF_UNIX), To(allow), Next);
                if network == NetworkMode::Loopback {
                    asm.jump(JEQ_K, af(libc::AF_INET), To(allow), Next);
                    asm.jump(JEQ_K, af(libc::AF_INET6), To(allow), Next);
                    let netlink = asm.label();
                    asm.jump(JEQ_K, af(libc::AF_NETLINK), To(netlink), Next);
                    asm.ret(refuse);
                    // Of netlink, only routing (interfaces, addresses) and socket diagnostics
                    // (`ss`): netfilter, audit, uevents and the rest are kernel surface a
                    // sandbox does not need.
                    asm.bind(netlink);
                    asm.load(arg_offset(2));
                    asm.jump(JEQ_K, af(libc::NETLINK_ROUTE), To(allow), Next);
                    asm.jump(JEQ_K, af(libc::NETLINK_SOCK_DIAG), To(allow), Next);
                }
                asm.ret(refuse);
            }
            Rule::DeviceNode(arg) => {
                // Of the file types (S_IFMT), exactly S_IFCHR (0o020000) and S_IFBLK
                // (0o060000) have bit 0o020000 without 0o100000 (S_IFLNK has both); the
                // unassigned 0o030000 and 0o070000, EINVAL anyway, are refused too.
                asm.load(arg_offset(arg));
                asm.jump(JSET_K, S_IFREG, To(allow), Next);
                asm.jump(JSET_K, S_IFCHR, To(eperm), To(allow));
            }
        }
    }
}

/// Every namespace flag of clone(2) (linux/sched.h).
const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET)
    .unsigned_abs();
const CLONE_NEWTIME: u32 = 0x80;

/// File type bits of a mode (linux/stat.h).
const S_IFREG: u32 = 0o100_000;
const S_IFCHR: u32 = 0o020_000;

fn af(value: libc::c_int) -> u32 {
    value.unsigned_abs()
}

/// Offset of the low 32 bits of argument `arg` (little-endian targets only: see
/// [`native_arch`]).
fn arg_offset(arg: u32) -> u32 {
    ARGS_OFFSET + 8 * arg
}

/// Emits a binary search over `entries` (sorted by number) with the syscall number in the
/// accumulator. Plain errno rules jump straight to a shared return; the others get a block
/// emitted later (collected in `blocks`).
fn search(
    asm: &mut Asm,
    entries: &[(u32, Rule)],
    eperm: Label,
    allow: Label,
    blocks: &mut Vec<(Label, Rule)>,
) {
    if entries.len() <= LEAF {
        for &(nr, rule) in entries {
            let target = match rule {
                Rule::Errno(libc::EPERM) => eperm,
                _ => {
                    let l = asm.label();
                    blocks.push((l, rule));
                    l
                }
            };
            asm.jump(JEQ_K, nr, To(target), Next);
        }
        asm.jump_always(allow);
        return;
    }
    let (low, high) = entries.split_at(entries.len() / 2);
    let upper = asm.label();
    asm.jump(JGE_K, high[0].0, To(upper), Next);
    search(asm, low, eperm, allow, blocks);
    asm.bind(upper);
    search(asm, high, eperm, allow, blocks);
}

/// A forward jump target while assembling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Label(usize);

/// Where a conditional jump goes.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// The next instruction.
    Next,
    /// A label bound later.
    To(Label),
}
use Target::{Next, To};

/// A tiny classic-BPF assembler with forward labels.
#[derive(Default)]
struct Asm {
    code: Vec<(u16, Target, Target, u32)>,
    labels: Vec<Option<usize>>,
}

impl Asm {
    fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    fn bind(&mut self, label: Label) {
        self.labels[label.0] = Some(self.code.len());
    }

    fn load(&mut self, offset: u32) {
        self.code.push((LD_W_ABS, Next, Next, offset));
    }

    fn jump(&mut self, op: u16, k: u32, jt: Target, jf: Target) {
        self.code.push((op, jt, jf, k));
    }

    /// An unconditional jump, as a comparison that always holds (`A >= 0`).
    fn jump_always(&mut self, to: Label) {
        self.code.push((JGE_K, To(to), To(to), 0));
    }

    fn ret(&mut self, decision: Decision) {
        self.code.push((RET_K, Next, Next, decision.ret()));
    }

    /// Resolves the labels; fails if a jump is backwards or longer than BPF's 255.
    fn finish(self) -> Result<SeccompProgram, JailError> {
        let offset = |at: usize, t: Target| -> Result<u8, JailError> {
            let dest = match t {
                Next => at + 1,
                To(l) => self.labels[l.0]
                    .ok_or_else(|| JailError::Seccomp("unbound label in the filter".into()))?,
            };
            dest.checked_sub(at + 1)
                .and_then(|d| u8::try_from(d).ok())
                .ok_or_else(|| JailError::Seccomp("a filter jump is out of range".into()))
        };
        let mut out = Vec::with_capacity(self.code.len());
        for (at, &(code, jt, jf, k)) in self.code.iter().enumerate() {
            let conditional = matches!(code, JEQ_K | JGE_K | JSET_K);
            let (jt, jf) = if conditional {
                (offset(at, jt)?, offset(at, jf)?)
            } else {
                (0, 0)
            };
            out.push(libc::sock_filter { code, jt, jf, k });
        }
        Ok(SeccompProgram(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(p: &SeccompProgram, nr: libc::c_long, args: [u64; 6]) -> Decision {
        p.decide(native_arch().unwrap(), nr as u32, args)
    }

    #[test]
    fn denied_syscalls_get_eperm_and_others_run() {
        for network in [NetworkMode::Off, NetworkMode::Loopback] {
            let p = build_filter(network).unwrap();
            for &(name, nr) in DENIED {
                assert_eq!(
                    decide(&p, nr, [0; 6]),
                    Decision::Errno(libc::EPERM),
                    "{name}"
                );
            }
            for nr in [
                libc::SYS_read,
                libc::SYS_write,
                libc::SYS_openat,
                libc::SYS_execve,
                libc::SYS_exit_group,
                libc::SYS_mmap,
                libc::SYS_socketpair,
                libc::SYS_prctl,
                libc::SYS_wait4,
            ] {
                assert_eq!(decide(&p, nr, [0; 6]), Decision::Allow, "syscall {nr}");
            }
            // Every number up to well past the table is decided without falling off the end.
            let denied: Vec<u32> = DENIED.iter().map(|&(_, nr)| nr as u32).collect();
            for nr in 0..600u32 {
                let d = p.decide(native_arch().unwrap(), nr, [0; 6]);
                if denied.contains(&nr) {
                    assert_eq!(d, Decision::Errno(libc::EPERM));
                } else {
                    assert_ne!(d, Decision::Kill, "syscall {nr}");
                }
            }
        }
    }

    #[test]
    fn conditional_rules() {
        let p = build_filter(NetworkMode::Off).unwrap();
        let newuser = libc::CLONE_NEWUSER as u64;
        let eperm = Decision::Errno(libc::EPERM);
        assert_eq!(
            decide(&p, libc::SYS_clone, [newuser | 17, 0, 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            decide(&p, libc::SYS_clone, [17, 0, 0, 0, 0, 0]),
            Decision::Allow
        );
        assert_eq!(
            decide(&p, libc::SYS_unshare, [newuser, 0, 0, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            decide(
                &p,
                libc::SYS_unshare,
                [libc::CLONE_FILES as u64, 0, 0, 0, 0, 0]
            ),
            Decision::Allow
        );
        assert_eq!(
            decide(&p, libc::SYS_clone3, [0; 6]),
            Decision::Errno(libc::ENOSYS)
        );
        assert_eq!(
            decide(&p, libc::SYS_personality, [0x0040000, 0, 0, 0, 0, 0]),
            eperm
        );
        for &ok in ALLOWED_PERSONAS {
            let d = decide(&p, libc::SYS_personality, [u64::from(ok), 0, 0, 0, 0, 0]);
            assert_eq!(d, Decision::Allow);
        }
        for bad in [TIOCSTI, TIOCLINUX] {
            let d = decide(&p, libc::SYS_ioctl, [0, u64::from(bad), 0, 0, 0, 0]);
            assert_eq!(d, eperm);
        }
        let tcgets = decide(&p, libc::SYS_ioctl, [0, 0x5401, 0, 0, 0, 0]);
        assert_eq!(tcgets, Decision::Allow);
        // Only the low 32 bits of an argument count, as the kernel reads them.
        let high = decide(
            &p,
            libc::SYS_ioctl,
            [0, (1 << 32) | u64::from(TIOCSTI), 0, 0, 0, 0],
        );
        assert_eq!(high, eperm);
    }

    #[test]
    fn sockets_by_network_mode() {
        let no = Decision::Errno(libc::EAFNOSUPPORT);
        let sock = |p: &SeccompProgram, family: i32, proto: i32| {
            decide(
                p,
                libc::SYS_socket,
                [family as u64, 1, proto as u64, 0, 0, 0],
            )
        };
        let off = build_filter(NetworkMode::Off).unwrap();
        assert_eq!(sock(&off, libc::AF_UNIX, 0), Decision::Allow);
        for family in [
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
            libc::AF_PACKET,
        ] {
            assert_eq!(sock(&off, family, 0), no, "family {family}");
        }
        let lo = build_filter(NetworkMode::Loopback).unwrap();
        for family in [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6] {
            assert_eq!(sock(&lo, family, 0), Decision::Allow, "family {family}");
        }
        for family in [libc::AF_PACKET, libc::AF_VSOCK, libc::AF_BLUETOOTH] {
            assert_eq!(sock(&lo, family, 0), no, "family {family}");
        }
        assert_eq!(
            sock(&lo, libc::AF_NETLINK, libc::NETLINK_ROUTE),
            Decision::Allow
        );
        assert_eq!(
            sock(&lo, libc::AF_NETLINK, libc::NETLINK_SOCK_DIAG),
            Decision::Allow
        );
        assert_eq!(sock(&lo, libc::AF_NETLINK, libc::NETLINK_AUDIT), no);
    }

    #[test]
    fn gvisor_also_refuses_device_nodes() {
        let eperm = Decision::Errno(libc::EPERM);
        let gvisor = build_profile(NetworkMode::Loopback, Profile::Gvisor).unwrap();
        let process = build_filter(NetworkMode::Loopback).unwrap();
        let kinds = [
            (libc::S_IFBLK, true),
            (libc::S_IFCHR, true),
            (libc::S_IFREG, false),
            (libc::S_IFIFO, false),
            (libc::S_IFSOCK, false),
            (libc::S_IFLNK, false),
            (0, false),
        ];
        for (kind, refused) in kinds {
            let mode = u64::from(kind | 0o600);
            let at = decide(&gvisor, libc::SYS_mknodat, [0, 0, mode, 0, 0, 0]);
            assert_eq!(at == eperm, refused, "mknodat {kind:o}");
            #[cfg(target_arch = "x86_64")]
            {
                let d = decide(&gvisor, libc::SYS_mknod, [0, mode, 0, 0, 0, 0]);
                assert_eq!(d == eperm, refused, "mknod {kind:o}");
            }
            // The process profile leaves them to the host kernel (no CAP_MKNOD).
            let p = decide(&process, libc::SYS_mknodat, [0, 0, mode, 0, 0, 0]);
            assert_eq!(p, Decision::Allow);
        }
        // Namespaces: every flag on gvisor, only a user namespace on process.
        let newns = [libc::CLONE_NEWNS as u64, 0, 0, 0, 0, 0];
        for nr in [libc::SYS_clone, libc::SYS_unshare] {
            assert_eq!(decide(&gvisor, nr, newns), eperm);
            assert_eq!(decide(&process, nr, newns), Decision::Allow);
            let thread = [(libc::CLONE_VM | libc::CLONE_THREAD) as u64, 0, 0, 0, 0, 0];
            assert_eq!(decide(&gvisor, nr, thread), Decision::Allow);
        }
        // Everything else is decided as for the process backend.
        #[cfg(target_arch = "x86_64")]
        let skip = [libc::SYS_mknodat as u32, libc::SYS_mknod as u32];
        #[cfg(not(target_arch = "x86_64"))]
        let skip = [libc::SYS_mknodat as u32];
        for nr in 0..600u32 {
            if skip.contains(&nr) {
                continue;
            }
            let args = [u64::from(libc::CLONE_NEWUSER.unsigned_abs()), 0, 0, 0, 0, 0];
            let (a, b) = (
                gvisor.decide(native_arch().unwrap(), nr, args),
                process.decide(native_arch().unwrap(), nr, args),
            );
            assert_eq!(a, b, "syscall {nr}");
        }
        assert!(gvisor.len() < 170, "{} instructions", gvisor.len());
    }

    #[test]
    fn foreign_architectures_are_killed() {
        let p = build_filter(NetworkMode::Loopback).unwrap();
        // AUDIT_ARCH_I386: i386 numbers differ (e.g. 1 is exit there, write here).
        assert_eq!(p.decide(0x4000_0003, 1, [0; 6]), Decision::Kill);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_numbers_are_refused() {
        let p = build_filter(NetworkMode::Loopback).unwrap();
        let getpid = X32_SYSCALL_BIT | libc::SYS_getpid as u32;
        let d = p.decide(native_arch().unwrap(), getpid, [0; 6]);
        assert_eq!(d, Decision::Errno(libc::EPERM));
    }

    #[test]
    fn the_program_is_short() {
        // Four seccompiler programs came to several hundred instructions; the kernel checks
        // and compiles every one at start-up.
        let p = build_filter(NetworkMode::Loopback).unwrap();
        assert!(p.len() < 160, "{} instructions", p.len());
    }
}
