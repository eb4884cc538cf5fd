//! Shared names and their interning: the hot path compares dense integer
//! ids, and rejections carry names without allocating.

use foldhash::HashMap;
use std::sync::Arc;

/// A shared, immutable name (pool, tier, AZ, capability, job): cloning it
/// never allocates, so rejections can carry names on the hot path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Arc<str>);

impl Name {
    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Self {
        Name(Arc::from(s))
    }
}

impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Names interned to dense ids, first come first numbered.
#[derive(Clone, Debug, Default)]
pub(crate) struct Interner {
    ids: HashMap<Name, u32>,
    names: Vec<Name>,
}

impl Interner {
    pub(crate) fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        let name = Name::from(name);
        self.names.push(name.clone());
        self.ids.insert(name, id);
        id
    }

    pub(crate) fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    pub(crate) fn name(&self, id: u32) -> &Name {
        &self.names[id as usize]
    }
}
