//! TLS on both sides, with rustls and its aws-lc-rs provider: the acceptor clients
//! reach (`ClientTls`, see `accept`), the connector towards PostgreSQL (`ServerTls`,
//! see `connect`), and building both from the config's PEM files. Both are rebuilt on
//! each reload; a side whose files cannot be used keeps its previous setup.

mod accept;
mod cn;
mod connect;
mod files;
pub mod suites;
mod verify;

use std::sync::Arc;

use rustls::client::Resumption;
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{ClientConfig, ServerConfig, SupportedProtocolVersion};

use crate::config::{ClientTlsMode, Config, ConfigError, ServerTlsMode};

pub use accept::{AcceptError, Negotiation, TLS_HANDSHAKE_RECORD, accept, describe, peer_common_name};
pub use cn::common_name;
pub use connect::{TlsConnectError, negotiate};
use verify::{Proof, ServerVerifier};

/// The ALPN protocol name of PostgreSQL; a direct TLS connection must offer it.
pub const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// A TLS file or setting that cannot be used: the `[general]` key and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError {
    pub key: &'static str,
    pub message: String,
}

fn error(key: &'static str) -> impl Fn(String) -> TlsError {
    move |message| TlsError { key, message }
}

/// One side's TLS: its mode and, unless that is `disable`, the rustls config built
/// from the config's files. The two sides are `ClientTls` and `ServerTls`.
#[derive(Debug)]
pub struct Tls<Mode, RustlsConfig> {
    pub mode: Mode,
    config: Option<Arc<RustlsConfig>>,
}

/// TLS towards clients: `client_tls_sslmode` and the rustls server config.
pub type ClientTls = Tls<ClientTlsMode, ServerConfig>;

/// TLS towards PostgreSQL: `server_tls_sslmode` and the rustls client config.
pub type ServerTls = Tls<ServerTlsMode, ClientConfig>;

impl<Mode, RustlsConfig> Tls<Mode, RustlsConfig> {
    fn new(mode: Mode, config: Option<RustlsConfig>) -> Self {
        Tls { mode, config: config.map(Arc::new) }
    }

    /// The rustls config, None when this side's TLS is disabled.
    pub fn config(&self) -> Option<&Arc<RustlsConfig>> {
        self.config.as_ref()
    }
}

impl Default for ClientTls {
    fn default() -> Self {
        Tls::new(ClientTlsMode::Disable, None)
    }
}

impl Default for ServerTls {
    fn default() -> Self {
        Tls::new(ServerTlsMode::Disable, None)
    }
}

impl ClientTls {
    /// Reads the certificate, key and (for verify modes) CA files named in the config.
    pub fn load(cfg: &Config) -> Result<ClientTls, TlsError> {
        match cfg.general.client_tls_sslmode {
            ClientTlsMode::Disable => Ok(ClientTls::default()),
            mode => Ok(Tls::new(mode, Some(server_config(cfg)?))),
        }
    }
}

impl ServerTls {
    /// Reads the CA (verify modes) and the optional client certificate and key.
    pub fn load(cfg: &Config) -> Result<ServerTls, TlsError> {
        let mode = cfg.general.server_tls_sslmode;
        let proof = match mode {
            ServerTlsMode::Disable => return Ok(ServerTls::default()),
            ServerTlsMode::Allow | ServerTlsMode::Prefer | ServerTlsMode::Require => Proof::Nothing,
            ServerTlsMode::VerifyCa => Proof::Chain(server_roots(cfg)?),
            ServerTlsMode::VerifyFull => Proof::ChainAndHost(server_roots(cfg)?),
        };
        Ok(Tls::new(mode, Some(client_config(cfg, proof)?)))
    }
}

fn server_config(cfg: &Config) -> Result<ServerConfig, TlsError> {
    let g = &cfg.general;
    let tls12 = suites::tls12_suites(&g.client_tls_ciphers).map_err(error("client_tls_ciphers"))?;
    let groups = suites::kx_groups(&g.client_tls_ecdhcurve).map_err(error("client_tls_ecdhcurve"))?;
    let provider = Arc::new(suites::provider(&tls12, groups));
    let certs = files::certs(&cfg.resolve(&g.client_tls_cert_file)).map_err(error("client_tls_cert_file"))?;
    let key = files::key(&cfg.resolve(&g.client_tls_key_file)).map_err(error("client_tls_key_file"))?;
    let versions = protocol_versions(&g.client_tls_protocols);
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| error("client_tls_protocols")(e.to_string()))?;
    // `auth_hba_file` `cert` lines ask for certificates where the mode does not: then
    // a client may present one (checked against the CA, as PostgreSQL checks one when
    // it has `ssl_ca_file`), and the other lines' clients need none.
    let optional = cfg.hba.as_ref().is_some_and(|h| h.first(crate::auth::client::Method::Cert).is_some());
    let builder = if g.client_tls_sslmode.verifies_client() || optional {
        let roots = files::roots(&cfg.resolve(&g.client_tls_ca_file)).map_err(error("client_tls_ca_file"))?;
        let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        if !g.client_tls_sslmode.verifies_client() {
            verifier = verifier.allow_unauthenticated();
        }
        let verifier = verifier.build().map_err(|e| error("client_tls_ca_file")(e.to_string()))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| error("client_tls_key_file")(format!("does not fit client_tls_cert_file: {e}")))?;
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    // Like PostgreSQL: no session resumption, so no tickets after the handshake (some
    // drivers trip over them, and each costs work during a login storm).
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(NoServerSessionStorage {});
    Ok(config)
}

fn protocol_versions(names: &[String]) -> Vec<&'static SupportedProtocolVersion> {
    let mut out = Vec::new();
    if names.iter().any(|n| n == "tlsv1.3") {
        out.push(&rustls::version::TLS13);
    }
    if names.iter().any(|n| n == "tlsv1.2") {
        out.push(&rustls::version::TLS12);
    }
    out
}

fn server_roots(cfg: &Config) -> Result<Arc<verify::Trusted>, TlsError> {
    let path = cfg.resolve(&cfg.general.server_tls_ca_file);
    let certs = files::certs(&path).map_err(error("server_tls_ca_file"))?;
    let trusted = verify::Trusted::new(certs)
        .map_err(|e| error("server_tls_ca_file")(format!("{}: unusable CA certificate: {e}", path.display())))?;
    Ok(Arc::new(trusted))
}

/// The rustls config towards PostgreSQL, checking what `proof` asks of its certificate.
fn client_config(cfg: &Config, proof: Proof) -> Result<ClientConfig, TlsError> {
    let g = &cfg.general;
    let tls12 = suites::tls12_suites(&g.server_tls_ciphers).map_err(error("server_tls_ciphers"))?;
    let provider = Arc::new(suites::provider(&tls12, rustls::crypto::aws_lc_rs::DEFAULT_KX_GROUPS.to_vec()));
    let verifier = ServerVerifier::new(provider.signature_verification_algorithms, proof);
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&protocol_versions(&g.server_tls_protocols))
        .map_err(|e| error("server_tls_protocols")(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = if g.server_tls_cert_file.is_empty() {
        builder.with_no_client_auth()
    } else {
        let certs = files::certs(&cfg.resolve(&g.server_tls_cert_file)).map_err(error("server_tls_cert_file"))?;
        let key = files::key(&cfg.resolve(&g.server_tls_key_file)).map_err(error("server_tls_key_file"))?;
        builder
            .with_client_auth_cert(certs, key)
            .map_err(|e| error("server_tls_key_file")(format!("does not fit server_tls_cert_file: {e}")))?
    };
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    // PostgreSQL does not resume sessions; some releases mishandled resumption attempts.
    config.resumption = Resumption::disabled();
    Ok(config)
}

/// Both sides, loaded at start-up: any unusable file is a config error.
pub fn load(cfg: &Config) -> Result<(ClientTls, ServerTls), ConfigError> {
    let as_config_error = |e: TlsError| cfg.general_error(e.key, e.message);
    Ok((ClientTls::load(cfg).map_err(as_config_error)?, ServerTls::load(cfg).map_err(as_config_error)?))
}

#[cfg(test)]
mod tests;
