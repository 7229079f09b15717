//! The `sluice` command: loads the config, sets up logging, runs the pooler.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sluice::app;
use sluice::config::{Config, LogFormat};

/// Sluice, a PostgreSQL connection pooler.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Path to the TOML configuration file.
    #[arg(short, long, default_value = "sluice.toml")]
    config: PathBuf,
    /// Check the configuration and exit.
    #[arg(long)]
    check: bool,
    /// Print a Sluice config converted from this PgBouncer config (pgbouncer.ini) and
    /// exit; what cannot be converted is noted on stderr and as comments.
    #[arg(long, value_name = "PGBOUNCER_INI")]
    from_pgbouncer: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(ini) = &cli.from_pgbouncer {
        return convert(ini);
    }
    let cfg = match Config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.check {
        if let Err(e) = sluice::tls::load(&cfg) {
            eprintln!("sluice: {e}");
            return ExitCode::from(2);
        }
        // Host names in listen_addr resolve when Sluice starts: checked here too.
        if let Err(e) = cfg.listen_ips() {
            eprintln!("sluice: {}: listen_addr: {e}", cli.config.display());
            return ExitCode::from(2);
        }
        for w in cfg.warnings() {
            eprintln!("sluice: warning: {w}");
        }
        println!("{}: configuration is valid", cli.config.display());
        return ExitCode::SUCCESS;
    }
    init_logging(&cfg);
    app::raise_fd_limit();
    let runtime = if cfg.workers() == 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(cfg.workers()).enable_all().build()
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async move {
        // First: a signal from here on (a logrotate SIGHUP during start-up) is taken
        // up once Sluice runs, not the default action, which would end the process.
        let signals = match app::Signals::install() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("sluice: cannot install signal handlers: {e}");
                return ExitCode::FAILURE;
            }
        };
        let listeners = match app::bind(&cfg) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("sluice: {e}");
                return ExitCode::FAILURE;
            }
        };
        let app = match app::App::new(cfg) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("sluice: {e}");
                return ExitCode::from(2);
            }
        };
        app::run(app, listeners, signals).await;
        ExitCode::SUCCESS
    });
    // Not waiting for blocking work still under way (a PAM check, a DNS lookup), which
    // could hold the exit without end: the shutdown is decided, and the listeners are
    // closed (`app::run`).
    runtime.shutdown_background();
    code
}

fn init_logging(cfg: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cfg.general.log_level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cfg.general.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// `--from-pgbouncer`: the converted config on stdout, the notes on stderr.
fn convert(ini: &std::path::Path) -> ExitCode {
    let text = match std::fs::read_to_string(ini) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sluice: {}: cannot read: {e}", ini.display());
            return ExitCode::from(2);
        }
    };
    match sluice::config::convert::from_pgbouncer_ini(&text) {
        Ok(c) => {
            print!("{}", c.toml);
            for n in &c.notes {
                eprintln!("sluice: {}: {n}", ini.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice: {}: {e}", ini.display());
            ExitCode::from(2)
        }
    }
}
