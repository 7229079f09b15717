//! What a reload keeps of the running `[general]` settings: the keys read only at
//! start-up, and a side's TLS keys when its new files cannot be used.

use super::{AuthType, Config, General};

/// Writes `General::START_UP_ONLY` and `Config::keep_start_up` from one list of keys.
macro_rules! start_up_only {
    ($($key:ident),*) => {
        impl General {
            /// Keys read only at start-up (listeners, threads, logging, the metrics
            /// endpoint): a reload keeps their running values, so the config in force
            /// (SHOW CONFIG) says what runs, and the file's new values wait for a restart.
            pub const START_UP_ONLY: &'static [&'static str] = &[$(stringify!($key)),*];
        }

        impl Config {
            /// Takes `running`'s values of the `START_UP_ONLY` keys (and the listen
            /// addresses parsed from them); gives the keys whose value in `self` (the
            /// file's) was different.
            pub fn keep_start_up(&mut self, running: &Config) -> Vec<&'static str> {
                let mut changed = Vec::new();
                let (new, old) = (&mut self.general, &running.general);
                $(
                    if new.$key != old.$key {
                        changed.push(stringify!($key));
                        new.$key.clone_from(&old.$key);
                    }
                )*
                self.listen.clone_from(&running.listen);
                changed
            }
        }
    };
}

start_up_only!(
    listen_addr,
    listen_port,
    unix_socket_dir,
    unix_socket_mode,
    unix_socket_group,
    listen_backlog,
    so_reuseport,
    peer_id,
    workers,
    log_level,
    log_format,
    metrics_listen
);

impl Config {
    /// Takes `running`'s client TLS keys (a reload whose client TLS files cannot be
    /// used), and its client authentication instead of a new `auth_type = "cert"`,
    /// which checks certificates through the new client setup: its `auth_type`, and an
    /// `hba` one's files and rules with it (the new config read none).
    pub fn keep_client_tls(&mut self, running: &Config) {
        let (new, old) = (&mut self.general, &running.general);
        new.client_tls_sslmode = old.client_tls_sslmode;
        new.client_tls_cert_file.clone_from(&old.client_tls_cert_file);
        new.client_tls_key_file.clone_from(&old.client_tls_key_file);
        new.client_tls_ca_file.clone_from(&old.client_tls_ca_file);
        new.client_tls_protocols.clone_from(&old.client_tls_protocols);
        new.client_tls_ciphers.clone_from(&old.client_tls_ciphers);
        new.client_tls_ecdhcurve.clone_from(&old.client_tls_ecdhcurve);
        if new.auth_type == AuthType::Cert {
            new.auth_type = old.auth_type;
            new.auth_hba_file.clone_from(&old.auth_hba_file);
            new.auth_ident_file.clone_from(&old.auth_ident_file);
            self.hba.clone_from(&running.hba);
        }
    }
}

impl General {
    /// Takes `running`'s server TLS keys (a reload whose server TLS files cannot be used).
    pub fn keep_server_tls(&mut self, running: &General) {
        self.server_tls_sslmode = running.server_tls_sslmode;
        self.server_tls_ca_file.clone_from(&running.server_tls_ca_file);
        self.server_tls_cert_file.clone_from(&running.server_tls_cert_file);
        self.server_tls_key_file.clone_from(&running.server_tls_key_file);
        self.server_tls_protocols.clone_from(&running.server_tls_protocols);
        self.server_tls_ciphers.clone_from(&running.server_tls_ciphers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LogFormat;

    #[test]
    fn a_reload_keeps_the_start_up_keys_and_names_the_changed_ones() {
        let parse = |text: &str| Config::parse(text, std::path::Path::new("x.toml")).unwrap();
        let running = parse("[general]\nauth_type = \"trust\"\n");
        let mut file =
            parse("[general]\nauth_type = \"trust\"\nlisten_port = 7000\nworkers = 3\ndefault_pool_size = 99\n");
        assert_eq!(file.keep_start_up(&running), ["listen_port", "workers"]);
        assert_eq!((file.general.listen_port, file.general.workers), (6432, 0));
        assert_eq!(file.general.default_pool_size, 99, "a key a reload takes");
        assert!(file.keep_start_up(&running).is_empty());
        // Every key listed is kept, with the addresses parsed from listen_addr.
        let mut all = General { listen_addr: vec!["::1".into()], unix_socket_dir: "/x".into(), ..General::default() };
        all.unix_socket_mode = "0700".into();
        all.listen_backlog = 7;
        all.so_reuseport = true;
        all.peer_id = 2;
        all.unix_socket_group = "g".into();
        all.log_level = "debug".into();
        all.log_format = LogFormat::Json;
        all.metrics_listen = "127.0.0.1:1".into();
        all.listen_port = 1;
        all.workers = 9;
        let mut all = Config { general: all, listen: vec!["::1".parse().unwrap()], ..running.clone() };
        assert_eq!(all.keep_start_up(&running), General::START_UP_ONLY);
        assert_eq!((all.general.listen_addr, all.listen), (running.general.listen_addr, running.listen));
    }
}
