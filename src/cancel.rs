//! Cancel keys: every client gets a BackendKeyData from Sluice (in session mode, the
//! real server's), registered here with a slot naming the server currently running
//! that client's query. A CancelRequest is forwarded to that server only.

use std::collections::hash_map::Entry;
use std::sync::Arc;

use foldhash::HashMap;
use parking_lot::Mutex;

use crate::server::ServerAddr;

/// The server a client's cancel would go to right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CancelTarget {
    pub addr: ServerAddr,
    pub pid: u32,
    pub secret: u32,
}

#[derive(Debug, Default)]
pub struct CancelSlot {
    target: Mutex<Option<CancelTarget>>,
}

impl CancelSlot {
    pub fn set(&self, target: Option<CancelTarget>) {
        *self.target.lock() = target;
    }

    pub fn get(&self) -> Option<CancelTarget> {
        self.target.lock().clone()
    }
}

#[derive(Debug, Default)]
pub struct CancelRegistry {
    map: Mutex<HashMap<(u32, u32), Arc<CancelSlot>>>,
}

/// A registered key; unregisters itself when dropped.
#[derive(Debug)]
pub struct CancelKey {
    registry: Arc<CancelRegistry>,
    pub pid: u32,
    pub secret: u32,
    pub slot: Arc<CancelSlot>,
}

impl Drop for CancelKey {
    fn drop(&mut self) {
        if let Entry::Occupied(e) = self.registry.map.lock().entry((self.pid, self.secret))
            && Arc::ptr_eq(e.get(), &self.slot)
        {
            e.remove();
        }
    }
}

impl CancelRegistry {
    /// Registers a fresh random key (transaction and statement mode).
    pub fn register(self: &Arc<Self>) -> CancelKey {
        loop {
            let pid = rand::random::<u32>() & 0x7fff_ffff;
            let secret = rand::random::<u32>();
            if pid == 0 {
                continue;
            }
            if let Some(k) = self.try_register(pid, secret) {
                return k;
            }
        }
    }

    /// Registers a given key (session mode: the server's own), replacing a stale entry.
    pub fn register_key(self: &Arc<Self>, pid: u32, secret: u32) -> CancelKey {
        let slot = Arc::new(CancelSlot::default());
        self.map.lock().insert((pid, secret), slot.clone());
        CancelKey { registry: self.clone(), pid, secret, slot }
    }

    fn try_register(self: &Arc<Self>, pid: u32, secret: u32) -> Option<CancelKey> {
        let slot = Arc::new(CancelSlot::default());
        match self.map.lock().entry((pid, secret)) {
            Entry::Occupied(_) => return None,
            Entry::Vacant(v) => v.insert(slot.clone()),
        };
        Some(CancelKey { registry: self.clone(), pid, secret, slot })
    }

    /// Where a CancelRequest for this key should go, if its client is running a query.
    pub fn target(&self, pid: u32, secret: u32) -> Option<CancelTarget> {
        let slot = self.map.lock().get(&(pid, secret)).cloned()?;
        slot.get()
    }

    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_register_and_unregister() {
        let r = Arc::new(CancelRegistry::default());
        let k = r.register();
        assert_eq!(r.target(k.pid, k.secret), None);
        let t = CancelTarget { addr: ServerAddr { host: "h".into(), port: 1 }, pid: 9, secret: 8 };
        k.slot.set(Some(t.clone()));
        assert_eq!(r.target(k.pid, k.secret), Some(t));
        assert_eq!(r.target(k.pid, k.secret ^ 1), None);
        let (pid, secret) = (k.pid, k.secret);
        drop(k);
        assert_eq!(r.target(pid, secret), None);
        assert!(r.is_empty());
    }

    #[test]
    fn replaced_key_survives_old_guard() {
        let r = Arc::new(CancelRegistry::default());
        let a = r.register_key(5, 6);
        let b = r.register_key(5, 6);
        drop(a);
        assert_eq!(r.len(), 1);
        drop(b);
        assert!(r.is_empty());
    }
}
