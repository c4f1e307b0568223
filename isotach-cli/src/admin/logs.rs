//! The daemons' log subscriber: tracing to stderr, filtered by `RUST_LOG` (or a default), with
//! a reload handle so the admin service can change the filter while the daemon runs.

use std::io::IsTerminal;
use std::sync::{Mutex, OnceLock};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

/// The reload handle and the filter text in force.
struct Control {
    handle: reload::Handle<EnvFilter, Registry>,
    current: Mutex<String>,
}

static CONTROL: OnceLock<Control> = OnceLock::new();

/// Installs the subscriber once per process; `RUST_LOG` overrides `default`.
pub(crate) fn init(default: &str) {
    let text = std::env::var("RUST_LOG")
        .ok()
        .filter(|t| EnvFilter::try_new(t).is_ok())
        .unwrap_or_else(|| default.to_string());
    let filter = EnvFilter::try_new(&text).unwrap_or_else(|_| EnvFilter::new("info"));
    let (layer, handle) = reload::Layer::new(filter);
    let installed = tracing_subscriber::registry()
        .with(layer)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colour only on a terminal: log files and journald get plain text.
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .try_init()
        .is_ok();
    if installed {
        let _ = CONTROL.set(Control {
            handle,
            current: Mutex::new(text),
        });
    }
}

/// Replaces the filter (RUST_LOG syntax); returns the one it replaced.
pub(crate) fn set_filter(text: &str) -> Result<String, String> {
    let control = CONTROL
        .get()
        .ok_or_else(|| "this process has no reloadable log subscriber".to_string())?;
    if text.len() > 1024 {
        return Err("log filter longer than 1024 bytes".into());
    }
    let filter = EnvFilter::try_new(text).map_err(|e| format!("bad log filter `{text}`: {e}"))?;
    control
        .handle
        .reload(filter)
        .map_err(|e| format!("log filter not replaced: {e}"))?;
    let mut current = control.current.lock().unwrap_or_else(|p| p.into_inner());
    Ok(std::mem::replace(&mut *current, text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_can_be_replaced_and_bad_ones_are_refused() {
        init("warn");
        let before = set_filter("debug").unwrap();
        assert!(!before.is_empty());
        assert!(tracing::enabled!(tracing::Level::DEBUG));
        assert_eq!(set_filter("error").unwrap(), "debug");
        assert!(!tracing::enabled!(tracing::Level::WARN));
        assert!(set_filter("=[{bad").is_err());
        assert!(set_filter(&"x".repeat(2000)).is_err());
        assert_eq!(
            set_filter("info").unwrap(),
            "error",
            "a refused filter changes nothing"
        );
    }
}
