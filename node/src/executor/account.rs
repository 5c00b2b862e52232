//! Which Unix user a rank runs as. A tenant's job is hostile input: it must
//! not run as root or as the agent's user, whose files hold the cluster's
//! keys and tokens. Under a root agent, ranks run as the tenant's user from
//! `executor.users`, else `executor.run_as`, else `shoal-job` (created when
//! missing); an agent that is not root can only run ranks as itself.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// The user created for ranks when nothing else is configured.
pub const DEFAULT_JOB_USER: &str = "shoal-job";
/// `run_as` value meaning the agent's own user.
pub const AGENT_USER: &str = "agent";

/// A Unix account a rank runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// Whom the configuration asks for; pure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The agent's own user: no switch.
    Agent,
    /// The named user.
    Named(String),
}

/// The executor's user settings.
#[derive(Clone, Debug, Default)]
pub struct RankUsers {
    pub run_as: Option<String>,
    pub users: BTreeMap<String, String>,
    pub allow_root: bool,
}

impl RankUsers {
    /// The user asked for `tenant`'s ranks, for an agent that is or is not root.
    pub fn choose(&self, tenant: &str, agent_is_root: bool) -> Choice {
        let name = self.users.get(tenant).or(self.run_as.as_ref());
        match name.map(String::as_str) {
            Some(AGENT_USER) => Choice::Agent,
            Some(name) => Choice::Named(name.to_string()),
            None if agent_is_root => Choice::Named(DEFAULT_JOB_USER.to_string()),
            None => Choice::Agent,
        }
    }

    /// The account `tenant`'s ranks run under, creating the default user
    /// when a root agent needs it; an error says why the rank cannot start.
    pub fn resolve(&self, tenant: &str) -> Result<Account, String> {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let account = match self.choose(tenant, me == 0) {
            Choice::Agent => by_uid(me)?,
            Choice::Named(name) => match by_name(&name)? {
                Some(a) => a,
                None if name == DEFAULT_JOB_USER && me == 0 => {
                    create_job_user()?;
                    by_name(&name)?.ok_or_else(|| format!("user {name} was not created"))?
                }
                None => {
                    return Err(format!(
                        "no Unix user '{name}' (executor.run_as / executor.users)"
                    ))
                }
            },
        };
        check(&account, me, self.allow_root)?;
        Ok(account)
    }
}

/// Refuses what the agent must not do: run a rank as root without
/// `allow_root`, or as another user without being root.
pub fn check(account: &Account, agent_uid: u32, allow_root: bool) -> Result<(), String> {
    if account.uid == 0 && !allow_root {
        return Err(format!(
            "refusing to run a rank as root ('{}'): set executor.run_as to an unprivileged user, or executor.allow_root = true",
            account.name
        ));
    }
    if account.uid != agent_uid && agent_uid != 0 {
        return Err(format!(
            "cannot run ranks as '{}': the agent is not root (set executor.run_as = \"agent\")",
            account.name
        ));
    }
    Ok(())
}

fn create_job_user() -> Result<(), String> {
    create_job_user_in(std::path::Path::new("/"))
}

/// Creates the default job user in the system rooted at `root` (`/`, or
/// an image being prepared: `useradd --root`); an existing one is kept.
pub fn create_job_user_in(root: &std::path::Path) -> Result<(), String> {
    let mut useradd = std::process::Command::new("useradd");
    if root != std::path::Path::new("/") {
        useradd.arg("--root").arg(root);
    }
    let status = useradd
        .args([
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            DEFAULT_JOB_USER,
        ])
        .status()
        .map_err(|e| format!("cannot run useradd to create {DEFAULT_JOB_USER}: {e}"))?;
    // 9: the user exists (another agent on this host created it first).
    if status.success() || status.code() == Some(9) {
        tracing::info!(
            user = DEFAULT_JOB_USER,
            "created the unprivileged user ranks run as"
        );
        Ok(())
    } else {
        Err(format!("useradd {DEFAULT_JOB_USER} failed: {status}"))
    }
}

fn account(pw: &libc::passwd) -> Account {
    // SAFETY: getpw*_r filled `pw` with pointers into our buffer, which
    // outlives this call; the strings are NUL-terminated.
    let text = |p: *const libc::c_char| unsafe {
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Account {
        name: text(pw.pw_name),
        uid: pw.pw_uid,
        gid: pw.pw_gid,
        home: PathBuf::from(text(pw.pw_dir)),
    }
}

fn by_name(name: &str) -> Result<Option<Account>, String> {
    let cname = CString::new(name).map_err(|_| format!("invalid user name '{name}'"))?;
    lookup(|pw, buf, out| {
        // SAFETY: valid pointers to our passwd, buffer and result slot.
        unsafe { libc::getpwnam_r(cname.as_ptr(), pw, buf.as_mut_ptr(), buf.len(), out) }
    })
}

fn by_uid(uid: u32) -> Result<Account, String> {
    lookup(|pw, buf, out| {
        // SAFETY: valid pointers to our passwd, buffer and result slot.
        unsafe { libc::getpwuid_r(uid, pw, buf.as_mut_ptr(), buf.len(), out) }
    })?
    .ok_or_else(|| format!("uid {uid} has no passwd entry"))
}

fn lookup(
    call: impl Fn(&mut libc::passwd, &mut [libc::c_char], &mut *mut libc::passwd) -> libc::c_int,
) -> Result<Option<Account>, String> {
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    // SAFETY: passwd is plain data; all-zero is a valid (empty) value.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    let rc = call(&mut pw, &mut buf, &mut out);
    if rc != 0 {
        return Err(format!(
            "passwd lookup failed: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    Ok((!out.is_null()).then(|| account(&pw)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(run_as: Option<&str>, per_tenant: &[(&str, &str)]) -> RankUsers {
        RankUsers {
            run_as: run_as.map(String::from),
            users: per_tenant
                .iter()
                .map(|(t, u)| (t.to_string(), u.to_string()))
                .collect(),
            allow_root: false,
        }
    }

    #[test]
    fn a_root_agent_runs_ranks_as_the_tenants_user_else_run_as_else_shoal_job() {
        let u = users(None, &[("vision", "vision")]);
        assert_eq!(u.choose("vision", true), Choice::Named("vision".into()));
        assert_eq!(
            u.choose("speech", true),
            Choice::Named(DEFAULT_JOB_USER.into())
        );
        assert_eq!(u.choose("speech", false), Choice::Agent);
        let u = users(Some("jobs"), &[("dev", AGENT_USER)]);
        assert_eq!(u.choose("speech", true), Choice::Named("jobs".into()));
        assert_eq!(u.choose("dev", true), Choice::Agent);
    }

    #[test]
    fn root_needs_allow_root_and_switching_needs_a_root_agent() {
        let root = Account {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: "/root".into(),
        };
        let job = Account {
            name: "job".into(),
            uid: 999,
            gid: 999,
            home: "/nonexistent".into(),
        };
        assert!(check(&root, 0, false)
            .unwrap_err()
            .contains("refusing to run a rank as root"));
        assert!(check(&root, 0, true).is_ok());
        assert!(check(&job, 0, false).is_ok());
        assert!(check(&job, 1000, false)
            .unwrap_err()
            .contains("the agent is not root"));
        assert!(check(&job, 999, false).is_ok());
    }

    #[test]
    fn the_agents_own_account_is_found() {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let account = by_uid(me).expect("own passwd entry");
        assert_eq!(account.uid, me);
        assert_eq!(by_name(&account.name).expect("lookup"), Some(account));
        assert_eq!(by_name("no-such-user-here").expect("lookup"), None);
    }
}
