//! The seccomp deny-list installed last, just before the guest agent takes over.
//!
//! Default allow, with a list of kernel-attack-surface and escape-helper syscalls refused. It
//! is several filters because seccompiler gives one match action per filter; the kernel runs
//! them all and the strictest result wins:
//! - the deny-list proper: `EPERM`, including conditional rules (new user namespaces through
//!   `clone`/`unshare`, unusual `personality` values, `TIOCSTI`/`TIOCLINUX` ioctls);
//! - `clone3` -> `ENOSYS`: its flags live in a struct a filter cannot read, and glibc falls back
//!   to `clone` (which we can inspect) on `ENOSYS` but not on `EPERM`;
//! - socket families -> `EAFNOSUPPORT`, which programs treat as "no such network";
//! - on x86_64, x32-ABI syscall numbers -> `EPERM`, because they would otherwise slip past
//!   every rule above (the rules match exact x86_64 numbers).
//!
//! Each seccompiler filter also kills the process on a foreign architecture (e.g. i386
//! `int 0x80` syscalls), which would otherwise bypass the rules as well.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use sandcell_protocol::isolation::{Feature, FeatureState};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

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
const ALLOWED_PERSONAS: &[u64] = &[0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

/// `ioctl` requests from asm-generic/ioctls.h (the same on x86_64 and aarch64).
const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;

/// Bit set in the syscall number of x32-ABI calls on x86_64 (`__X32_SYSCALL_BIT`).
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Names of the syscalls refused outright with `EPERM` (conditional rules are in
/// [`install`]'s detail).
pub fn denied_syscalls() -> &'static [&'static str] {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| DENIED.iter().map(|(name, _)| *name).collect())
}

/// Compiles the filters for `network`; apply them with [`apply_filters`].
pub fn build_filters(network: NetworkMode) -> Result<Vec<BpfProgram>, JailError> {
    let arch = target_arch()?;
    let mut filters = vec![
        compile("deny-list", deny_rules()?, libc::EPERM, arch)?,
        compile(
            "clone3",
            BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
            libc::ENOSYS,
            arch,
        )?,
        compile("socket", socket_rules(network)?, libc::EAFNOSUPPORT, arch)?,
    ];
    #[cfg(target_arch = "x86_64")]
    filters.push(x32_guard());
    Ok(filters)
}

/// Loads `filters` into the calling thread (and so into every process it later starts).
///
/// Allocates nothing on success, so it is safe in a child forked from a threaded process.
/// Sets `no_new_privs` first, as the kernel requires without `CAP_SYS_ADMIN`.
pub fn apply_filters(filters: &[BpfProgram]) -> Result<(), JailError> {
    for filter in filters {
        seccompiler::apply_filter(filter)
            .map_err(|e| JailError::Seccomp(format!("load filter: {e}")))?;
    }
    Ok(())
}

/// Builds and loads the filters for `network`, reporting what is refused.
pub fn install(network: NetworkMode) -> Result<Feature, JailError> {
    let filters = build_filters(network)?;
    apply_filters(&filters)?;
    Ok(feature(network))
}

/// The report line for filters built for `network` and applied.
pub fn feature(network: NetworkMode) -> Feature {
    Feature {
        name: "seccomp".into(),
        state: FeatureState::Active,
        detail: describe(network),
    }
}

/// One line saying what the filters for `network` refuse.
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

fn target_arch() -> Result<TargetArch, JailError> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| JailError::Seccomp(format!("unsupported architecture: {e}")))
}

type Rules = BTreeMap<i64, Vec<SeccompRule>>;

/// Default allow; the syscalls in `rules` (when their conditions hold) fail with `errno`.
fn compile(
    what: &str,
    rules: Rules,
    errno: i32,
    arch: TargetArch,
) -> Result<BpfProgram, JailError> {
    let errno =
        u32::try_from(errno).map_err(|_| JailError::Seccomp(format!("bad errno {errno}")))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        arch,
    )
    .and_then(BpfProgram::try_from)
    .map_err(|e| JailError::Seccomp(format!("compile the {what} filter: {e}")))?;
    Ok(filter)
}

fn deny_rules() -> Result<Rules, JailError> {
    let mut rules: Rules = DENIED.iter().map(|&(_, nr)| (nr, Vec::new())).collect();
    // New user namespaces are the door to the kernel's namespaced-root attack surface; other
    // namespace flags need capabilities the sandbox no longer has.
    let newuser = u64::from(libc::CLONE_NEWUSER.unsigned_abs());
    let newuser_rule = || rule(&[(0, SeccompCmpOp::MaskedEq(newuser), newuser)]);
    rules.insert(libc::SYS_clone, vec![newuser_rule()?]);
    rules.insert(libc::SYS_unshare, vec![newuser_rule()?]);
    let personas: Vec<_> = ALLOWED_PERSONAS
        .iter()
        .map(|&p| (0, SeccompCmpOp::Ne, p))
        .collect();
    rules.insert(libc::SYS_personality, vec![rule(&personas)?]);
    // TIOCSTI fakes terminal input for whoever owns the terminal; TIOCLINUX reaches the console.
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(&[(1, SeccompCmpOp::Eq, TIOCSTI)])?,
            rule(&[(1, SeccompCmpOp::Eq, TIOCLINUX)])?,
        ],
    );
    Ok(rules)
}

fn socket_rules(network: NetworkMode) -> Result<Rules, JailError> {
    let allowed: &[libc::c_int] = match network {
        NetworkMode::Off => &[libc::AF_UNIX],
        // Netlink stays usable so `ip addr` and glibc's interface queries work on loopback.
        NetworkMode::Loopback => &[
            libc::AF_UNIX,
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
        ],
    };
    let conditions: Vec<_> = allowed
        .iter()
        .map(|&af| (0, SeccompCmpOp::Ne, u64::from(af.unsigned_abs())))
        .collect();
    let mut rules = vec![rule(&conditions)?];
    if allowed.contains(&libc::AF_NETLINK) {
        // Of netlink, only routing (interfaces, addresses) and socket diagnostics (`ss`):
        // netfilter, audit, uevents and the rest are kernel surface a sandbox does not need.
        rules.push(rule(&[
            (
                0,
                SeccompCmpOp::Eq,
                u64::from(libc::AF_NETLINK.unsigned_abs()),
            ),
            (
                2,
                SeccompCmpOp::Ne,
                u64::from(libc::NETLINK_ROUTE.unsigned_abs()),
            ),
            (
                2,
                SeccompCmpOp::Ne,
                u64::from(libc::NETLINK_SOCK_DIAG.unsigned_abs()),
            ),
        ])?);
    }
    Ok(BTreeMap::from([(libc::SYS_socket, rules)]))
}

/// A rule matching when all `(argument index, comparison, value)` conditions hold. Arguments
/// are compared on their low 32 bits: the kernel reads these ones as `int`.
fn rule(conditions: &[(u8, SeccompCmpOp, u64)]) -> Result<SeccompRule, JailError> {
    let conditions = conditions
        .iter()
        .map(|(arg, op, value)| {
            SeccompCondition::new(*arg, SeccompCmpArgLen::Dword, op.clone(), *value)
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(SeccompRule::new)
        .map_err(|e| JailError::Seccomp(format!("build rule: {e}")))?;
    Ok(conditions)
}

/// A hand-written program refusing x32-ABI syscall numbers, which seccompiler cannot express.
#[cfg(target_arch = "x86_64")]
fn x32_guard() -> BpfProgram {
    // Classic BPF opcodes (linux/bpf_common.h) and the seccomp_data layout (linux/seccomp.h).
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    const NR_OFFSET: u32 = 0;
    const ARCH_OFFSET: u32 = 4;
    // AUDIT_ARCH_X86_64 = EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE.
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    let op = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        op(LD_W_ABS, 0, 0, ARCH_OFFSET),
        // Another architecture: allow here, the other filters kill it.
        op(JEQ_K, 0, 3, AUDIT_ARCH_X86_64),
        op(LD_W_ABS, 0, 0, NR_OFFSET),
        op(JGE_K, 0, 1, X32_SYSCALL_BIT),
        op(
            RET_K,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | libc::EPERM.unsigned_abs(),
        ),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}
