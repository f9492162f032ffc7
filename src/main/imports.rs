//! `tollgate import-nginx` and `tollgate import-ingress`: the translation
//! written out, its notes on stderr, the result checked, the exit code.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use tollgate::import::Severity;
use tollgate::Config;

pub fn import_nginx(conf: &Path, output: Option<&Path>) -> ExitCode {
    let imported = match tollgate::import::import(conf) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("tollgate: cannot read {}: {e}", conf.display());
            return ExitCode::FAILURE;
        }
    };
    let notes = imported
        .notes
        .iter()
        .map(|n| (n.at.to_string(), n.severity, n.message.as_str()));
    let lost = imported.lost().then_some("the nginx config");
    finish(notes, output, &imported.yaml, &imported.yaml, lost)
}

/// Prints each note, writes `yaml`, checks `config` as `tollgate check`
/// would, and gives the exit code: 2 when `lost` names what was not all
/// translated.
fn finish<'a>(
    notes: impl Iterator<Item = (String, Severity, &'a str)>,
    output: Option<&Path>,
    yaml: &str,
    config: &str,
    lost: Option<&str>,
) -> ExitCode {
    for (at, severity, message) in notes {
        let what = match severity {
            Severity::Skipped => "not translated",
            Severity::Lost => "NOT EQUIVALENT",
        };
        eprintln!("{at}: {what}: {message}");
    }
    if let Err(e) = write_out(output, yaml) {
        eprintln!("tollgate: {e:#}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = Config::from_yaml(config, &|name| std::env::var(name).ok()) {
        eprintln!("tollgate: the written config does not pass `tollgate check` here: {e}");
        return ExitCode::FAILURE;
    }
    if let Some(what) = lost {
        eprintln!(
            "tollgate: some of {what} was not translated (NOT EQUIVALENT above); review the YAML"
        );
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}

/// Writes `text` to `path`, or stdout.
fn write_out(path: Option<&Path>, text: &str) -> anyhow::Result<()> {
    match path {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
        }
        None => std::io::stdout()
            .write_all(text.as_bytes())
            .context("cannot write the YAML"),
    }
}

pub fn import_ingress(
    files: &[PathBuf],
    output: Option<&Path>,
    options: &tollgate::import::IngressOptions,
) -> ExitCode {
    let mut sources = Vec::new();
    let stdin = [PathBuf::from("-")];
    for path in if files.is_empty() { &stdin[..] } else { files } {
        let read = if path.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map(|_| ("stdin".to_owned(), text))
        } else {
            std::fs::read_to_string(path).map(|text| (path.display().to_string(), text))
        };
        match read {
            Ok(source) => sources.push(source),
            Err(e) => {
                eprintln!("tollgate: cannot read {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    let imported = match tollgate::import::import_ingress(&sources, options) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("tollgate: cannot read the manifests: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The chart adds listeners; the rest must pass `tollgate check` as is.
    let mut config = imported.config.clone();
    if let serde_yaml::Value::Mapping(map) = &mut config {
        let listener = serde_yaml::from_str("[{ bind: '127.0.0.1:0' }]").unwrap_or_default();
        map.insert("listeners".into(), listener);
    }
    let config = serde_yaml::to_string(&config).unwrap_or_default();
    let notes = imported
        .notes
        .iter()
        .map(|n| (n.at.clone(), n.severity, n.message.as_str()));
    let lost = imported.lost().then_some("the Ingresses");
    finish(notes, output, &imported.yaml, &config, lost)
}
