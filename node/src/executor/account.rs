//! Which Unix user a rank runs as. A tenant's job is hostile input: it must
//! not run as root or as the agent's user, whose files hold the cluster's
//! keys and tokens, nor as another tenant's user, which could ptrace its
//! ranks, read their environment, signal them and read their files. Under
//! a root agent, ranks run as the tenant's user from `executor.users`, else
//! `executor.run_as` (one user the operator chose for every tenant), else
//! a user of the tenant's own, `shoal-t-<tenant>`, which the agent creates
//! when missing and removes once the tenant is gone and none of its files
//! remain on the node. An agent that is not root can only run ranks as
//! itself.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// What the agent writes in the comment (GECOS) field of a tenant user it
/// created, followed by the tenant's name: how it finds its own users again.
pub const TENANT_USER_COMMENT: &str = "shoal tenant ";
/// Longest user name `useradd` takes everywhere.
const MAX_USER_NAME: usize = 32;
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
    /// The tenant's own user, created by the agent when missing.
    Tenant(String),
}

/// The Unix user a tenant's ranks run as when no mapping is configured:
/// `shoal-t-<tenant>` when that is a portable user name (lower case, digits,
/// `-`, `_`, at most 32 characters), else `shoal-x-` and 16 hex digits of the
/// name's BLAKE3 hash. The two prefixes differ, so no tenant's plain name can
/// equal another's hashed one; distinct tenants get distinct users.
pub fn tenant_user_name(tenant: &str) -> String {
    let plain = format!("shoal-t-{tenant}");
    let portable = !tenant.is_empty()
        && tenant
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_'));
    if portable && plain.len() <= MAX_USER_NAME {
        return plain;
    }
    let hash = blake3::hash(tenant.as_bytes()).to_hex();
    format!("shoal-x-{}", &hash.as_str()[..16])
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
            None if agent_is_root => Choice::Tenant(tenant_user_name(tenant)),
            None => Choice::Agent,
        }
    }

    /// The account `tenant`'s ranks run under, creating the tenant's own
    /// user when a root agent needs it; an error says why the rank cannot
    /// start.
    pub fn resolve(&self, tenant: &str) -> Result<Account, String> {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let account = match self.choose(tenant, me == 0) {
            Choice::Agent => by_uid(me)?,
            Choice::Named(name) => by_name(&name)?.ok_or_else(|| {
                format!("no Unix user '{name}' (executor.run_as / executor.users)")
            })?,
            Choice::Tenant(name) => match by_name(&name)? {
                Some(a) => a,
                None => {
                    create_tenant_user(&name, tenant)?;
                    by_name(&name)?.ok_or_else(|| format!("user {name} was not created"))?
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

/// Creates `name`, the user of `tenant`'s ranks: a system user with its own
/// group, no home and no login shell, marked as the agent's in its comment.
/// One made meanwhile by another agent on this host is kept.
fn create_tenant_user(name: &str, tenant: &str) -> Result<(), String> {
    let status = std::process::Command::new("useradd")
        .args([
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            &format!("{TENANT_USER_COMMENT}{tenant}"),
            name,
        ])
        .status()
        .map_err(|e| format!("cannot run useradd to create {name}: {e}"))?;
    // 9: the user exists (another agent on this host created it first).
    if status.success() || status.code() == Some(9) {
        tracing::info!(
            user = name,
            tenant,
            "created the Unix user of a tenant's ranks"
        );
        Ok(())
    } else {
        Err(format!("useradd {name} failed: {status}"))
    }
}

/// The tenant users this host's agents created, as (user, tenant), read
/// from `passwd` (the file `useradd` writes).
pub fn tenant_users(passwd: &str) -> Vec<(String, String)> {
    passwd
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            let tenant = fields.get(4)?.strip_prefix(TENANT_USER_COMMENT)?;
            let user = *fields.first()?;
            (tenant_user_name(tenant) == user).then(|| (user.to_string(), tenant.to_string()))
        })
        .collect()
}

/// Removes the tenant user `name`. `userdel` refuses while one of its
/// processes runs (another agent on this host may still use it); that is
/// an error to try again later, not a reason to force it.
pub fn remove_tenant_user(name: &str) -> Result<(), String> {
    let status = std::process::Command::new("userdel")
        .arg(name)
        .status()
        .map_err(|e| format!("cannot run userdel {name}: {e}"))?;
    // 6: already gone.
    if status.success() || status.code() == Some(6) {
        tracing::info!(
            user = name,
            "removed the Unix user of a tenant that is gone"
        );
        Ok(())
    } else {
        Err(format!("userdel {name} failed: {status}"))
    }
}

/// The uid of user `name`, if there is one.
pub fn uid_of(name: &str) -> Result<Option<u32>, String> {
    Ok(by_name(name)?.map(|a| a.uid))
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
    fn a_root_agent_runs_ranks_as_the_mapped_user_else_run_as_else_the_tenants_own() {
        let u = users(None, &[("vision", "vision")]);
        assert_eq!(u.choose("vision", true), Choice::Named("vision".into()));
        assert_eq!(
            u.choose("speech", true),
            Choice::Tenant("shoal-t-speech".into())
        );
        assert_eq!(u.choose("speech", false), Choice::Agent);
        let u = users(Some("jobs"), &[("dev", AGENT_USER)]);
        assert_eq!(u.choose("speech", true), Choice::Named("jobs".into()));
        assert_eq!(u.choose("dev", true), Choice::Agent);
    }

    #[test]
    fn every_tenant_gets_a_user_name_of_its_own_that_useradd_takes() {
        assert_eq!(tenant_user_name("vision"), "shoal-t-vision");
        assert_eq!(tenant_user_name("team_a-1"), "shoal-t-team_a-1");
        // Upper case, dots and long names are hashed; the prefix differs.
        for odd in ["Vision", "a.b", &"x".repeat(40)] {
            let name = tenant_user_name(odd);
            assert!(name.starts_with("shoal-x-"), "{name}");
            assert_eq!(name.len(), 24);
        }
        assert_ne!(tenant_user_name("Vision"), tenant_user_name("vision"));
        assert_ne!(tenant_user_name("a.b"), tenant_user_name("a-b"));
    }

    proptest::proptest! {
        #[test]
        fn distinct_tenants_never_share_a_user(a in "[a-zA-Z0-9._-]{1,63}", b in "[a-zA-Z0-9._-]{1,63}") {
            let (ua, ub) = (tenant_user_name(&a), tenant_user_name(&b));
            proptest::prop_assert!(ua.len() <= MAX_USER_NAME);
            proptest::prop_assert!(ua.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'));
            if a != b {
                proptest::prop_assert_ne!(ua, ub);
            }
        }
    }

    #[test]
    fn only_the_agents_own_tenant_users_are_found_in_passwd() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
            shoal-t-vision:x:998:998:shoal tenant vision:/nonexistent:/usr/sbin/nologin\n\
            shoal-x-0123456789abcdef:x:997:997:shoal tenant speech:/nonexistent:/usr/sbin/nologin\n\
            alice:x:1000:1000:shoal tenant alice:/home/alice:/bin/bash\n";
        // A comment that names a tenant whose user would be another name
        // is not ours (alice; the forged hash).
        assert_eq!(
            tenant_users(passwd),
            vec![("shoal-t-vision".to_string(), "vision".to_string())]
        );
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
