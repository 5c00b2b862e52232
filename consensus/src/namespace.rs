//! The `mesh:/` namespace of `shoal cp`: path → manifest and holders. The
//! contents live as chunks in the nodes' chunk stores; the ledger holds only
//! what is needed to find and verify them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::ids::NodeId;

/// Longest mesh path.
pub const MAX_PATH: usize = 1024;
/// Largest manifest one object may record in the ledger.
pub const MAX_OBJECT_MANIFEST: usize = 4 << 20;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct MeshObject {
    /// Absolute, normalised: `/a/b`.
    pub path: String,
    /// A directory tree (`cp -r`) or a single file (the manifest's one entry).
    pub is_dir: bool,
    pub manifest: Vec<u8>,
    pub bytes: u64,
    pub files: u64,
    pub holders: Vec<NodeId>,
    pub replica: u32,
    pub tenant: String,
    pub mtime_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Namespace {
    pub objects: BTreeMap<String, MeshObject>,
}

/// `/a/b` from `a/b`, `/a//b/`, refusing `.` and `..` components.
pub fn normalize(path: &str) -> Result<String, String> {
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" => {}
            "." | ".." => return Err(format!("mesh path '{path}' may not contain '.' or '..'")),
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err("a mesh path needs at least one component (mesh:/name)".into());
    }
    let normalized = format!("/{}", parts.join("/"));
    if normalized.len() > MAX_PATH {
        return Err(format!("mesh paths are at most {MAX_PATH} bytes"));
    }
    Ok(normalized)
}

impl Namespace {
    pub fn put(&mut self, object: &MeshObject, replace: bool) -> Result<(), String> {
        let path = normalize(&object.path)?;
        if object.manifest.len() > MAX_OBJECT_MANIFEST {
            return Err(format!(
                "the manifest of {path} is {} bytes; the limit is {MAX_OBJECT_MANIFEST}",
                object.manifest.len()
            ));
        }
        if object.holders.is_empty() {
            return Err(format!("{path} has no holders"));
        }
        if !replace && self.objects.contains_key(&path) {
            return Err(format!(
                "mesh:{path} already exists (use --force to replace it)"
            ));
        }
        // A file and a directory may not shadow each other.
        if let Some(parent) = self
            .objects
            .keys()
            .find(|p| path.starts_with(&format!("{p}/")))
        {
            return Err(format!(
                "mesh:{parent} is an object; it cannot contain mesh:{path}"
            ));
        }
        let prefix = format!("{path}/");
        if self.objects.keys().any(|p| p.starts_with(&prefix)) {
            return Err(format!("mesh:{path} already holds other objects below it"));
        }
        let mut object = object.clone();
        object.path = path.clone();
        self.objects.insert(path, object);
        Ok(())
    }

    /// Removes the object at `path` or every object below it.
    pub fn remove(&mut self, path: &str) -> Result<usize, String> {
        let path = normalize(path)?;
        let prefix = format!("{path}/");
        let before = self.objects.len();
        self.objects
            .retain(|p, _| p != &path && !p.starts_with(&prefix));
        match before - self.objects.len() {
            0 => Err(format!("mesh:{path} does not exist")),
            n => Ok(n),
        }
    }

    pub fn set_holders(&mut self, path: &str, holders: &[NodeId]) -> Result<(), String> {
        let object = self
            .objects
            .get_mut(path)
            .ok_or_else(|| format!("mesh:{path} does not exist"))?;
        let mut unique = Vec::new();
        for h in holders {
            if !unique.contains(h) {
                unique.push(*h);
            }
        }
        if unique.is_empty() {
            return Err("an object needs at least one holder".into());
        }
        object.holders = unique;
        Ok(())
    }

    /// Objects at or below `path` (`/` lists everything).
    pub fn list(&self, path: &str) -> Vec<&MeshObject> {
        let path = path.trim_end_matches('/');
        self.objects
            .values()
            .filter(|o| {
                path.is_empty() || o.path == path || o.path.starts_with(&format!("{path}/"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(path: &str) -> MeshObject {
        MeshObject {
            path: path.into(),
            is_dir: false,
            manifest: vec![1],
            bytes: 1,
            files: 1,
            holders: vec![1, 2, 3],
            replica: 3,
            tenant: "default".into(),
            mtime_ms: 0,
        }
    }

    #[test]
    fn paths_normalise_and_objects_do_not_shadow_each_other() {
        assert_eq!(normalize("a//b/").as_deref(), Ok("/a/b"));
        assert!(normalize("/a/../b").is_err());
        assert!(normalize("/").is_err());
        let mut ns = Namespace::default();
        ns.put(&object("/data/x.bin"), false).expect("put");
        assert!(ns
            .put(&object("/data/x.bin"), false)
            .unwrap_err()
            .contains("--force"));
        ns.put(&object("/data/x.bin"), true).expect("replace");
        assert!(ns.put(&object("/data/x.bin/y"), false).is_err());
        assert!(ns.put(&object("/data"), false).is_err());
        ns.put(&object("/data/y.bin"), false).expect("put");
        assert_eq!(ns.list("/data").len(), 2);
        assert_eq!(ns.remove("/data"), Ok(2));
        assert!(ns.remove("/data").is_err());
    }
}
