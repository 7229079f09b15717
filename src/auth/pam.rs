//! `auth_type = "pam"`: the client's clear-text password checked by PAM (Linux-PAM's
//! `pam_authenticate` and `pam_acct_mgmt` under `pam_service`), as PgBouncer does.
//! libpam is loaded when first needed (`dlopen` of `libpam.so.0`), so Sluice builds and
//! runs without it where PAM is not used. Each check blocks (a PAM module may ask a
//! directory server), so it runs on a blocking thread (`Checks::pam`).

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::ptr;

/// The library's file name (the Linux-PAM ABI Sluice speaks).
const LIBRARY: &CStr = c"libpam.so.0";

const PAM_SUCCESS: c_int = 0;
const PAM_RHOST: c_int = 4;
const PAM_FAIL_DELAY: c_int = 10;
const PAM_PROMPT_ECHO_OFF: c_int = 1;
const PAM_CONV_ERR: c_int = 19;

#[repr(C)]
struct Message {
    style: c_int,
    text: *const c_char,
}

#[repr(C)]
struct Response {
    text: *mut c_char,
    code: c_int,
}

type Converse = unsafe extern "C" fn(c_int, *mut *const Message, *mut *mut Response, *mut c_void) -> c_int;

#[repr(C)]
struct Conversation {
    converse: Converse,
    data: *mut c_void,
}

type Start = unsafe extern "C" fn(*const c_char, *const c_char, *const Conversation, *mut *mut c_void) -> c_int;
type StartIn =
    unsafe extern "C" fn(*const c_char, *const c_char, *const Conversation, *const c_char, *mut *mut c_void) -> c_int;
type WithFlags = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type SetItem = unsafe extern "C" fn(*mut c_void, c_int, *const c_void) -> c_int;
type Describe = unsafe extern "C" fn(*mut c_void, c_int) -> *const c_char;

/// The loaded library's entry points (kept loaded for the process's life).
#[derive(Debug)]
pub struct Pam {
    start: Start,
    /// `pam_start_confdir` (Linux-PAM 1.4 and later), for `pam_config_dir`.
    start_in: Option<StartIn>,
    authenticate: WithFlags,
    account: WithFlags,
    end: WithFlags,
    set_item: SetItem,
    describe: Describe,
}

/// What a check is asked.
pub struct Ask<'a> {
    pub service: &'a str,
    /// A directory of PAM service files instead of the system's (`pam_config_dir`).
    pub config_dir: Option<&'a str>,
    pub user: &'a str,
    pub password: &'a [u8],
    /// The client's address (PAM_RHOST), when it came over TCP.
    pub host: Option<String>,
}

/// Why a check did not pass: the password or account was refused, or PAM could not run
/// the check (its message, for the log).
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    Denied(String),
    Failed(String),
}

impl Pam {
    /// Loads libpam.
    pub fn load() -> Result<Pam, String> {
        // SAFETY: dlopen with a NUL-terminated name; the handle is never closed, so the
        // function pointers taken from it stay valid.
        let lib = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            // SAFETY: dlerror returns a NUL-terminated message or null.
            let why = unsafe { libc::dlerror() };
            let why = if why.is_null() { "not found".into() } else { unsafe { CStr::from_ptr(why) }.to_string_lossy() };
            return Err(format!("cannot load {}: {why}", LIBRARY.to_string_lossy()));
        }
        let symbol = |name: &CStr| {
            // SAFETY: a symbol lookup in a handle dlopen returned.
            let f = unsafe { libc::dlsym(lib, name.as_ptr()) };
            (!f.is_null()).then_some(f)
        };
        let need = |name: &CStr| symbol(name).ok_or_else(|| format!("libpam has no {}", name.to_string_lossy()));
        // SAFETY: each symbol is Linux-PAM's function of that name, with the signature
        // its header gives (`security/pam_appl.h`).
        unsafe {
            Ok(Pam {
                start: std::mem::transmute::<*mut c_void, Start>(need(c"pam_start")?),
                start_in: symbol(c"pam_start_confdir").map(|f| std::mem::transmute::<*mut c_void, StartIn>(f)),
                authenticate: std::mem::transmute::<*mut c_void, WithFlags>(need(c"pam_authenticate")?),
                account: std::mem::transmute::<*mut c_void, WithFlags>(need(c"pam_acct_mgmt")?),
                end: std::mem::transmute::<*mut c_void, WithFlags>(need(c"pam_end")?),
                set_item: std::mem::transmute::<*mut c_void, SetItem>(need(c"pam_set_item")?),
                describe: std::mem::transmute::<*mut c_void, Describe>(need(c"pam_strerror")?),
            })
        }
    }

    /// Whether `pam_config_dir` can be used (`pam_start_confdir`).
    pub fn has_config_dir(&self) -> bool {
        self.start_in.is_some()
    }

    /// Authenticates `ask.user` with `ask.password` and checks the account (expired,
    /// locked...). Blocks.
    pub fn check(&self, ask: &Ask) -> Result<(), Refusal> {
        let cstr = |s: &str| CString::new(s).map_err(|_| Refusal::Denied("a NUL character in the user name".into()));
        let (service, user) = (cstr(ask.service)?, cstr(ask.user)?);
        let password = CString::new(ask.password).map_err(|_| Refusal::Denied("a NUL in the password".into()))?;
        let conversation = Conversation { converse, data: password.as_ptr() as *mut c_void };
        let mut handle = ptr::null_mut();
        let started = match (ask.config_dir, self.start_in) {
            (None, _) => {
                // SAFETY: valid C strings and conversation, which outlive the handle.
                unsafe { (self.start)(service.as_ptr(), user.as_ptr(), &conversation, &mut handle) }
            }
            (Some(dir), Some(start_in)) => {
                let dir = cstr(dir).map_err(|_| Refusal::Failed("a NUL character in pam_config_dir".into()))?;
                // SAFETY: as above; PAM copies the directory name.
                unsafe { start_in(service.as_ptr(), user.as_ptr(), &conversation, dir.as_ptr(), &mut handle) }
            }
            (Some(_), None) => return Err(Refusal::Failed("this libpam has no pam_start_confdir".into())),
        };
        if started != PAM_SUCCESS {
            let (service, hint) = (ask.service, "no service file, nor \"other\"?");
            return Err(Refusal::Failed(format!("pam_start failed for service \"{service}\" ({started}: {hint})")));
        }
        let mut session = Session { pam: self, handle, status: PAM_SUCCESS };
        if let Some(host) = ask.host.as_deref().and_then(|h| CString::new(h).ok()) {
            // SAFETY: PAM copies the item.
            unsafe { (self.set_item)(handle, PAM_RHOST, host.as_ptr() as *const c_void) };
        }
        // Modules that delay a failure (pam_unix, pam_faildelay) call this instead of
        // sleeping on the checking thread: Sluice has its own `auth_failure_delay`.
        // SAFETY: the item is a function pointer of the type Linux-PAM calls.
        unsafe { (self.set_item)(handle, PAM_FAIL_DELAY, no_delay as *const c_void) };
        // SAFETY: a live handle; flags 0.
        session.status = unsafe { (self.authenticate)(handle, 0) };
        if session.status != PAM_SUCCESS {
            return Err(Refusal::Denied(session.describe()));
        }
        // SAFETY: as above.
        session.status = unsafe { (self.account)(handle, 0) };
        if session.status != PAM_SUCCESS {
            return Err(Refusal::Denied(session.describe()));
        }
        Ok(())
    }
}

/// A PAM transaction, ended when dropped with the status of its last call (which the
/// modules' cleanup sees).
struct Session<'a> {
    pam: &'a Pam,
    handle: *mut c_void,
    status: c_int,
}

/// PAM_FAIL_DELAY's callback: no delay.
extern "C" fn no_delay(_status: c_int, _micros: std::ffi::c_uint, _data: *mut c_void) {}

impl Session<'_> {
    /// The last call's status in words.
    fn describe(&self) -> String {
        let code = self.status;
        // SAFETY: pam_strerror returns a static NUL-terminated message.
        let text = unsafe { (self.pam.describe)(self.handle, code) };
        if text.is_null() {
            format!("PAM error {code}")
        } else {
            unsafe { CStr::from_ptr(text) }.to_string_lossy().into()
        }
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle pam_start gave, ended once.
        unsafe { (self.pam.end)(self.handle, self.status) };
    }
}

/// PAM's questions: a prompt with echo off (a password prompt) is answered with the
/// password; a prompt with echo on (a user name, a one-time code) and messages get no
/// answer, as in PgBouncer, so a module asking something other than the password never
/// sees it. Responses are allocated with `malloc`, as PAM frees them.
unsafe extern "C" fn converse(
    count: c_int,
    messages: *mut *const Message,
    responses: *mut *mut Response,
    data: *mut c_void,
) -> c_int {
    if count <= 0 || messages.is_null() || responses.is_null() {
        return PAM_CONV_ERR;
    }
    let n = count as usize;
    // SAFETY: calloc of `n` responses, zeroed (null texts), freed by PAM.
    let out = unsafe { libc::calloc(n, std::mem::size_of::<Response>()) } as *mut Response;
    if out.is_null() {
        return PAM_CONV_ERR;
    }
    for i in 0..n {
        // SAFETY: Linux-PAM passes an array of `count` message pointers.
        let style = unsafe { (**messages.add(i)).style };
        if style == PAM_PROMPT_ECHO_OFF {
            // SAFETY: `data` is the password's C string, alive for the transaction.
            let copy = unsafe { libc::strdup(data as *const c_char) };
            if copy.is_null() {
                // SAFETY: the texts copied so far and the array, all from malloc.
                unsafe { (0..i).for_each(|j| libc::free((*out.add(j)).text as *mut c_void)) };
                unsafe { libc::free(out as *mut c_void) };
                return PAM_CONV_ERR;
            }
            // SAFETY: `out` has `n` entries.
            unsafe { (*out.add(i)).text = copy };
        }
    }
    // SAFETY: PAM takes the array.
    unsafe { *responses = out };
    PAM_SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A PAM service file in `dir` whose check (pam_exec, handed the password) lets in
    /// `alice` with `s3cret` only.
    pub fn service(dir: &std::path::Path, name: &str) {
        let script = dir.join("check.sh");
        let check = "#!/bin/sh\nread -r pw\n[ \"$PAM_USER\" = alice ] && [ \"$pw\" = s3cret ]\n";
        std::fs::write(&script, check).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let text = format!(
            "auth required pam_exec.so expose_authtok quiet {}\naccount required pam_permit.so\n",
            script.display()
        );
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn pam_checks_the_password_through_a_service_file() {
        let dir = tempfile::tempdir().unwrap();
        service(dir.path(), "sluice-test");
        let pam = Pam::load().unwrap();
        let path = dir.path().to_str().unwrap();
        let ask = |user, password| Ask {
            service: "sluice-test",
            config_dir: Some(path),
            user,
            password,
            host: Some("127.0.0.1".into()),
        };
        assert_eq!(pam.check(&ask("alice", b"s3cret")), Ok(()));
        assert!(matches!(pam.check(&ask("alice", b"wrong")), Err(Refusal::Denied(_))));
        assert!(matches!(pam.check(&ask("bob", b"s3cret")), Err(Refusal::Denied(_))));
        assert!(matches!(pam.check(&ask("alice", b"s3c\0ret")), Err(Refusal::Denied(_))));
        let missing = Ask { service: "no-such-service", ..ask("alice", b"s3cret") };
        let got = pam.check(&missing);
        let want = "pam_start failed for service \"no-such-service\" (26: no service file, nor \"other\"?)";
        assert_eq!(got, Err(Refusal::Failed(want.into())));
    }

    /// Only a password prompt (echo off) gets the password: a prompt with echo on (a
    /// one-time code, say) and messages get none.
    #[test]
    fn only_a_password_prompt_is_answered_with_the_password() {
        const PAM_PROMPT_ECHO_ON: c_int = 2;
        const PAM_ERROR_MSG: c_int = 3;
        let texts = [c"Password: ", c"Passcode or option: ", c"a message"];
        let messages = [(PAM_PROMPT_ECHO_OFF, texts[0]), (PAM_PROMPT_ECHO_ON, texts[1]), (PAM_ERROR_MSG, texts[2])]
            .map(|(style, text)| Message { style, text: text.as_ptr() });
        let mut pointers: Vec<*const Message> = messages.iter().map(|m| m as *const Message).collect();
        let password = c"s3cret";
        let mut responses: *mut Response = ptr::null_mut();
        // SAFETY: three valid messages, the password a C string alive for the call.
        let rc = unsafe { converse(3, pointers.as_mut_ptr(), &mut responses, password.as_ptr() as *mut c_void) };
        assert_eq!(rc, PAM_SUCCESS);
        // SAFETY: `converse` gave an array of three responses from calloc.
        let answers: Vec<Option<String>> = (0..3)
            .map(|i| unsafe {
                let text = (*responses.add(i)).text;
                let answer = (!text.is_null()).then(|| CStr::from_ptr(text).to_string_lossy().into_owned());
                libc::free(text as *mut c_void);
                answer
            })
            .collect();
        unsafe { libc::free(responses as *mut c_void) };
        assert_eq!(answers, [Some("s3cret".to_string()), None, None]);
    }
}
