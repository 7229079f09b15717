//! The system's user and group databases (`/etc/passwd` and `/etc/group`, or whatever
//! `/etc/nsswitch.conf` names: they may be remote, so callers on the runtime's threads
//! look up on a blocking thread): the OS user's name for `peer` logins, a group's ID for
//! `unix_socket_group`.

use std::ffi::{CStr, CString};

/// The name of OS user `uid` (`getpwuid_r`); `None` for none, or one that is not UTF-8.
pub fn user_name(uid: u32) -> Option<String> {
    with_buffer(|buf| {
        // SAFETY: `pwd` and `found` are valid out-pointers, `buf` is a writable buffer
        // of the length given; on success `pw_name` points into `buf`, read before it
        // is given back.
        unsafe {
            let mut pwd: libc::passwd = std::mem::zeroed();
            let mut found: *mut libc::passwd = std::ptr::null_mut();
            let rc = libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr().cast(), buf.len(), &mut found);
            let name = (rc == 0 && !found.is_null() && !pwd.pw_name.is_null()).then(|| CStr::from_ptr(pwd.pw_name));
            (rc, name.and_then(|n| n.to_str().ok()).map(String::from))
        }
    })
    .ok()
    .flatten()
}

/// The ID of the OS group `name` (`getgrnam_r`).
pub fn group_id(name: &str) -> std::io::Result<u32> {
    let none = || std::io::Error::new(std::io::ErrorKind::NotFound, format!("no group named \"{name}\""));
    let cname = CString::new(name).map_err(|_| none())?;
    let gid = with_buffer(|buf| {
        // SAFETY: `grp` and `found` are valid out-pointers, `buf` is a writable buffer
        // of the length given; only `gr_gid` (a plain number) is read from the result.
        unsafe {
            let mut grp: libc::group = std::mem::zeroed();
            let mut found: *mut libc::group = std::ptr::null_mut();
            let rc = libc::getgrnam_r(cname.as_ptr(), &mut grp, buf.as_mut_ptr().cast(), buf.len(), &mut found);
            (rc, (!found.is_null()).then_some(grp.gr_gid))
        }
    });
    gid.map_err(std::io::Error::from_raw_os_error)?.ok_or_else(none)
}

/// Runs a `get*_r` lookup with a buffer grown while it answers `ERANGE` (up to 1 MiB);
/// its error number otherwise, or what it found.
fn with_buffer<T>(mut lookup: impl FnMut(&mut [u8]) -> (i32, Option<T>)) -> Result<Option<T>, i32> {
    let mut buf = vec![0u8; 1024];
    loop {
        match lookup(&mut buf) {
            (libc::ERANGE, _) if buf.len() < 1 << 20 => buf.resize(buf.len() * 2, 0),
            (0, found) => return Ok(found),
            (rc, _) => return Err(rc),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_os_user_of_this_process_is_named() {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let id = std::process::Command::new("id").arg("-un").output().expect("id runs");
        let expected = String::from_utf8(id.stdout).unwrap();
        assert_eq!(user_name(uid).as_deref(), Some(expected.trim()));
        assert_eq!(user_name(u32::MAX - 7), None, "no such user");
    }

    #[test]
    fn groups_are_found_by_name() {
        assert_eq!(group_id("root").unwrap(), 0);
        let e = group_id("no-such-group-here").unwrap_err();
        assert_eq!(e.to_string(), "no group named \"no-such-group-here\"");
    }
}
