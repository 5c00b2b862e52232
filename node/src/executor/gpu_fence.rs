//! The GPU device fence: a cgroup-device BPF program on every rank's
//! cgroup that lets the rank open only its own GPUs' `/dev/nvidiaN`. The
//! rank's user may have permission to open every GPU node of the host
//! (they are usually 0666), and `CUDA_VISIBLE_DEVICES` is only advice to
//! CUDA, so without this fence a tenant's rank could use, or read the
//! memory of, another tenant's GPU on the same node. This is what
//! systemd's `DeviceAllow=` and Slurm's `ConstrainDevices` do on cgroup v2.
//!
//! The policy ([`allows`]) touches GPU nodes only: character devices of
//! the NVIDIA major whose minor is a GPU (0–253). Everything else — the
//! driver's control nodes (`nvidiactl` 195:255, `nvidia-modeset`
//! 195:254) which every CUDA process opens, `nvidia-uvm` (its own major),
//! disks, terminals — is left to file permissions, which already keep an
//! unprivileged rank out of what is not its own. The program is attached
//! with `BPF_F_ALLOW_MULTI`: it adds to whatever an ancestor cgroup
//! enforces (a container's own device policy still holds), and the
//! attachment lives as long as the rank's cgroup.
//!
//! No crate loads a hand-built program of this type without an ELF object
//! and a BPF toolchain (aya, libbpf-rs), and the program is eleven
//! instructions plus one per GPU, so it is assembled here ([`program`])
//! and loaded through the `bpf(2)` system call. A small interpreter
//! ([`run`]) checks in tests that the assembled program decides exactly
//! like the policy.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The character-device major of `/dev/nvidia*` (the driver's
/// `NV_MAJOR_DEVICE_NUMBER`).
pub const NVIDIA_MAJOR: u32 = 195;
/// Minors above this are the driver's control nodes, not GPUs.
pub const LAST_GPU_MINOR: u32 = 253;

/// `BPF_DEVCG_DEV_CHAR`, the low half of `bpf_cgroup_dev_ctx.access_type`.
const DEV_CHAR: u32 = 2;

/// One `struct bpf_insn`: opcode, `dst | src << 4`, offset, immediate.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

// The opcodes the program uses (linux/bpf_common.h, linux/bpf.h).
const LDX_MEM_W: u8 = 0x61; // dst = *(u32 *)(src + off)
const ALU64_AND_K: u8 = 0x57; // dst &= imm
const ALU64_MOV_K: u8 = 0xb7; // dst = imm
const JMP_JEQ_K: u8 = 0x15; // if dst == imm goto pc + 1 + off
const JMP_JGT_K: u8 = 0x25; // if dst > imm (unsigned) goto ...
const JMP_JNE_K: u8 = 0x55; // if dst != imm goto ...
const JMP_EXIT: u8 = 0x95; // return r0

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (dst & 0x0f) | (src << 4),
        off,
        imm,
    }
}

/// Whether a rank allowed the GPU minors `allowed` may use the device
/// (`dev_type`, `major`, `minor`): the policy [`program`] implements.
pub fn allows(allowed: &BTreeSet<u32>, dev_type: u32, major: u32, minor: u32) -> bool {
    dev_type != DEV_CHAR
        || major != NVIDIA_MAJOR
        || minor > LAST_GPU_MINOR
        || allowed.contains(&minor)
}

/// The cgroup-device program for a rank allowed the GPU minors `allowed`
/// (minors above [`LAST_GPU_MINOR`] are not GPUs and are ignored).
pub fn program(allowed: &BTreeSet<u32>) -> Vec<Insn> {
    let minors: Vec<u32> = allowed
        .iter()
        .copied()
        .filter(|m| *m <= LAST_GPU_MINOR)
        .collect();
    // r1 points at struct bpf_cgroup_dev_ctx { access_type, major, minor }.
    let mut p = vec![
        insn(LDX_MEM_W, 2, 1, 0, 0),
        insn(ALU64_AND_K, 2, 0, 0, 0xffff),
        insn(LDX_MEM_W, 3, 1, 4, 0),
        insn(LDX_MEM_W, 4, 1, 8, 0),
    ];
    // Jumps to "allow" are patched once its position is known.
    let mut to_allow = Vec::new();
    for (reg, code, imm) in [
        (2, JMP_JNE_K, DEV_CHAR),
        (3, JMP_JNE_K, NVIDIA_MAJOR),
        (4, JMP_JGT_K, LAST_GPU_MINOR),
    ]
    .into_iter()
    .chain(minors.iter().map(|m| (4, JMP_JEQ_K, *m)))
    {
        to_allow.push(p.len());
        // Every immediate here is at most 0xffff.
        p.push(insn(
            code,
            reg,
            0,
            0,
            i32::try_from(imm).unwrap_or(i32::MAX),
        ));
    }
    p.push(insn(ALU64_MOV_K, 0, 0, 0, 0));
    p.push(insn(JMP_EXIT, 0, 0, 0, 0));
    let allow = p.len();
    p.push(insn(ALU64_MOV_K, 0, 0, 0, 1));
    p.push(insn(JMP_EXIT, 0, 0, 0, 0));
    for at in to_allow {
        // At most 254 GPUs plus a few: well inside an i16.
        p[at].off = i16::try_from(allow - at - 1).unwrap_or(i16::MAX);
    }
    p
}

/// Runs `prog` on a device access, as the kernel would: the program's
/// answer (non-zero: allowed). Only the opcodes [`program`] emits are
/// known; anything else is an error, as is running off the end.
pub fn run(prog: &[Insn], access_type: u32, major: u32, minor: u32) -> Result<bool, String> {
    let ctx = [access_type, major, minor];
    let mut r = [0u64; 11];
    let mut pc = 0usize;
    for _ in 0..=prog.len() {
        let i = prog
            .get(pc)
            .ok_or_else(|| format!("ran off the program at {pc}"))?;
        let dst = usize::from(i.regs & 0x0f);
        let src = usize::from(i.regs >> 4);
        let imm = i.imm as u64;
        let jump = |taken: bool| {
            if taken {
                pc as i64 + 1 + i64::from(i.off)
            } else {
                pc as i64 + 1
            }
        };
        let next = match i.code {
            LDX_MEM_W => {
                if src != 1 || i.off % 4 != 0 {
                    return Err(format!("unexpected load at {pc}"));
                }
                let field = usize::try_from(i.off / 4).map_err(|_| "negative offset")?;
                r[dst] = u64::from(
                    *ctx.get(field)
                        .ok_or_else(|| format!("load past the context at {pc}"))?,
                );
                pc as i64 + 1
            }
            ALU64_AND_K => {
                r[dst] &= imm;
                pc as i64 + 1
            }
            ALU64_MOV_K => {
                r[dst] = imm;
                pc as i64 + 1
            }
            JMP_JEQ_K => jump(r[dst] == imm),
            JMP_JGT_K => jump(r[dst] > imm),
            JMP_JNE_K => jump(r[dst] != imm),
            JMP_EXIT => return Ok(r[0] != 0),
            other => return Err(format!("unknown opcode {other:#x} at {pc}")),
        };
        pc = usize::try_from(next).map_err(|_| format!("jump before the start at {pc}"))?;
    }
    Err("the program loops".into())
}

// bpf(2): the commands, types and flags used (linux/bpf.h).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;
/// Loads tried while the verifier is interrupted (EAGAIN), as libbpf does.
const LOAD_ATTEMPTS: u32 = 5;
/// Loaded fences kept for reuse ([`loaded`]).
const LOADED_MAX: usize = 256;

/// The `BPF_PROG_LOAD` part of `union bpf_attr`, up to the field used.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// The `BPF_PROG_ATTACH` part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialised `repr(C)` prefix of `union
    // bpf_attr` of the size passed; the kernel reads (and for some
    // commands writes) only within it and zero-extends the rest.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Loads `prog` into the kernel; on a refusal by the verifier its log is
/// part of the error.
fn load(prog: &[Insn]) -> io::Result<OwnedFd> {
    if cfg!(target_endian = "big") {
        // `Insn` puts dst in the low nibble: the little-endian layout.
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the GPU device fence is built for little-endian hosts only",
        ));
    }
    let license = c"Apache-2.0";
    let mut name = [0u8; 16];
    name[..9].copy_from_slice(b"shoal_gpu");
    let attr = |log: Option<&mut Vec<u8>>| {
        let mut a = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
            insn_cnt: prog.len() as u32,
            insns: prog.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_name: name,
            expected_attach_type: BPF_CGROUP_DEVICE,
            ..ProgLoadAttr::default()
        };
        if let Some(buf) = log {
            a.log_level = 1;
            a.log_size = buf.len() as u32;
            a.log_buf = buf.as_mut_ptr() as u64;
        }
        a
    };
    // The kernel answers EAGAIN when a signal interrupts the verifier (the
    // agent's runtime signals its threads); libbpf retries too.
    let mut attempts = 0;
    let first = loop {
        match bpf(BPF_PROG_LOAD, &mut attr(None)) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && attempts < LOAD_ATTEMPTS => {
                attempts += 1;
            }
            other => break other,
        }
    };
    let fd = match first {
        Ok(fd) => fd,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EACCES)) => {
            let mut log = vec![0u8; 16 * 1024];
            match bpf(BPF_PROG_LOAD, &mut attr(Some(&mut log))) {
                Ok(fd) => fd,
                Err(again) => {
                    let text = String::from_utf8_lossy(&log);
                    let text = text.trim_end_matches('\0').trim();
                    return Err(io::Error::new(
                        again.kind(),
                        format!("{again}; verifier: {text}"),
                    ));
                }
            }
        }
        Err(e) => return Err(e),
    };
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("bpf returned an invalid fd"))?;
    // SAFETY: the kernel just handed us this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Loads the fence allowing `allowed`, or hands out the one loaded for the
/// same GPUs before: the verifier's pass is most of a fence's cost, and a
/// program may be attached to any number of cgroups.
fn loaded(allowed: &BTreeSet<u32>) -> io::Result<Arc<OwnedFd>> {
    static LOADED: Mutex<BTreeMap<BTreeSet<u32>, Arc<OwnedFd>>> = Mutex::new(BTreeMap::new());
    let cached = |map: &BTreeMap<BTreeSet<u32>, Arc<OwnedFd>>| map.get(allowed).cloned();
    if let Some(prog) = LOADED.lock().ok().and_then(|map| cached(&map)) {
        return Ok(prog);
    }
    let prog = Arc::new(load(&program(allowed))?);
    if let Ok(mut map) = LOADED.lock() {
        // Bounded: the subsets of a node's GPUs that ranks were given.
        if map.len() >= LOADED_MAX {
            map.clear();
        }
        map.insert(allowed.clone(), prog.clone());
    }
    Ok(prog)
}

/// Attaches the fence allowing the GPU minors `allowed` to the cgroup
/// `dir`, before any process is in it.
pub fn attach(dir: &Path, allowed: &BTreeSet<u32>) -> io::Result<()> {
    let prog = loaded(allowed)?;
    let cgroup = std::fs::File::open(dir)?;
    let mut attr = ProgAttachAttr {
        target_fd: cgroup.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
        replace_bpf_fd: 0,
    };
    // The attachment holds the program: both descriptors may close now.
    bpf(BPF_PROG_ATTACH, &mut attr).map(|_| ())
}

/// Whether this host lets the agent fence devices under `parent`: a
/// fence on a scratch cgroup there, removed again.
pub fn probe(parent: &Path) -> io::Result<()> {
    let scratch = parent.join(format!("gpu-fence-probe-{}", std::process::id()));
    match std::fs::create_dir(&scratch) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let attached = attach(&scratch, &BTreeSet::new());
    let removed = std::fs::remove_dir(&scratch);
    attached?;
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BLOCK: u32 = 1;

    fn set(m: &[u32]) -> BTreeSet<u32> {
        m.iter().copied().collect()
    }

    #[test]
    fn a_rank_opens_its_own_gpus_and_the_control_nodes_only() {
        let mine = set(&[1, 3]);
        let p = program(&mine);
        assert_eq!(p.len(), 4 + 3 + 2 + 4);
        let char_dev = |major, minor| run(&p, (6 << 16) | DEV_CHAR, major, minor);
        assert_eq!(char_dev(195, 1), Ok(true));
        assert_eq!(char_dev(195, 3), Ok(true));
        assert_eq!(char_dev(195, 0), Ok(false));
        assert_eq!(char_dev(195, 2), Ok(false));
        assert_eq!(char_dev(195, 253), Ok(false));
        assert_eq!(char_dev(195, 254), Ok(true), "nvidia-modeset");
        assert_eq!(char_dev(195, 255), Ok(true), "nvidiactl");
        assert_eq!(char_dev(1, 3), Ok(true), "/dev/null");
        assert_eq!(char_dev(508, 0), Ok(true), "nvidia-uvm");
        assert_eq!(run(&p, BLOCK, 195, 0), Ok(true), "a block device");
        // No GPU: no GPU node at all.
        let none = program(&BTreeSet::new());
        assert_eq!(run(&none, DEV_CHAR, 195, 0), Ok(false));
        assert_eq!(run(&none, DEV_CHAR, 195, 255), Ok(true));
    }

    #[test]
    fn control_minors_in_the_allowed_set_add_no_instruction() {
        assert_eq!(program(&set(&[254, 255])), program(&BTreeSet::new()));
    }

    #[test]
    fn the_interpreter_refuses_what_the_program_never_does() {
        let bad = [insn(0x07, 0, 0, 0, 1), insn(JMP_EXIT, 0, 0, 0, 0)];
        assert!(run(&bad, 0, 0, 0).is_err());
        let off_the_end = [insn(ALU64_MOV_K, 0, 0, 0, 1)];
        assert!(run(&off_the_end, 0, 0, 0).is_err());
        let looping = [insn(JMP_JEQ_K, 0, 0, -1, 0)];
        assert!(run(&looping, 0, 0, 0).is_err());
    }

    proptest! {
        /// The assembled program decides every access exactly like the policy.
        #[test]
        fn the_program_is_the_policy(
            allowed in proptest::collection::btree_set(0u32..300, 0..20),
            access in 0u32..8,
            dev_type in prop_oneof![Just(1u32), Just(2u32), 0u32..4],
            major in prop_oneof![Just(NVIDIA_MAJOR), 0u32..600],
            minor in prop_oneof![0u32..300, Just(LAST_GPU_MINOR), Just(254), Just(255)],
        ) {
            let p = program(&allowed);
            let decided = run(&p, (access << 16) | dev_type, major, minor);
            prop_assert_eq!(decided, Ok(allows(&allowed, dev_type, major, minor)));
        }
    }
}
