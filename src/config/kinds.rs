//! The kinds a setting takes its value from: pool modes, authentication types, TLS
//! modes and log formats.

use serde::{Deserialize, Serialize};

/// How long a server connection stays lent to one client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    Session,
    Transaction,
    Statement,
}

impl PoolMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
            Self::Statement => "statement",
        }
    }
}

/// How clients prove who they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub enum AuthType {
    #[serde(rename = "trust")]
    Trust,
    #[serde(rename = "md5")]
    Md5,
    /// `"scram"` is accepted as a short spelling.
    #[serde(rename = "scram-sha-256", alias = "scram")]
    ScramSha256,
    /// The client's TLS certificate proves the user: its common name must equal the user name.
    #[serde(rename = "cert")]
    Cert,
    /// The password in clear text (PgBouncer's `plain`; deprecated there too).
    #[serde(rename = "plain")]
    Plain,
    /// The method is the `auth_hba_file`'s line that fits the login.
    #[serde(rename = "hba")]
    Hba,
    /// No authentication and the client's user name ignored (PgBouncer's `any`): every
    /// database logs in as its own `user`, and anyone may use the admin console as an admin.
    #[serde(rename = "any")]
    Any,
    /// The clear-text password checked by PAM (`pam_service`); users need not be listed,
    /// and an unlisted one logs in to the server with the password PAM accepted.
    #[serde(rename = "pam")]
    Pam,
}

impl AuthType {
    /// The method every login uses; `None` for `hba`, where the file decides.
    pub fn method(self) -> Option<crate::auth::client::Method> {
        use crate::auth::client::Method;
        Some(match self {
            AuthType::Trust => Method::Trust,
            AuthType::Md5 => Method::Md5,
            AuthType::ScramSha256 => Method::ScramSha256,
            AuthType::Cert => Method::Cert,
            AuthType::Plain => Method::Password,
            AuthType::Any => Method::Any,
            AuthType::Pam => Method::Pam,
            AuthType::Hba => return None,
        })
    }
}

/// TLS towards clients (PgBouncer's `client_tls_sslmode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientTlsMode {
    /// SSLRequest is answered 'N'; no TLS.
    Disable,
    /// TLS when the client asks for it (same as `prefer` on this side).
    Allow,
    Prefer,
    /// TCP clients must use TLS; plaintext logins get FATAL 28000.
    Require,
    /// Like `require`, and the client must present a certificate signed by `client_tls_ca_file`.
    VerifyCa,
    /// Same as `verify-ca` (PgBouncer semantics); `auth_type = "cert"` checks the name.
    VerifyFull,
}

impl ClientTlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Allow => "allow",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// Whether plaintext TCP logins are refused.
    pub fn requires_tls(self) -> bool {
        self >= Self::Require
    }

    /// Whether clients must present a certificate.
    pub fn verifies_client(self) -> bool {
        self >= Self::VerifyCa
    }
}

/// TLS towards PostgreSQL (libpq's `sslmode`; `allow` as PgBouncer has it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerTlsMode {
    /// Plaintext; no SSLRequest is sent.
    Disable,
    /// Same as `prefer`, as in PgBouncer (which requests TLS in every mode but
    /// `disable`; libpq's `allow` tries plaintext first).
    Allow,
    /// TLS when the server supports it, without checking its certificate; else plaintext.
    Prefer,
    /// TLS or fail, without checking the server's certificate.
    Require,
    /// TLS, and the certificate chain must lead to `server_tls_ca_file`.
    VerifyCa,
    /// Like `verify-ca`, and the certificate must name the host Sluice connected to.
    VerifyFull,
}

impl ServerTlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Allow => "allow",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

/// The TLS versions `client_tls_protocols` and `server_tls_protocols` may list.
pub const TLS_PROTOCOLS: [&str; 2] = ["tlsv1.2", "tlsv1.3"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}
