//! Reads an nginx config the way nginx does: directives ending in `;`,
//! blocks in `{ }`, words, single- and double-quoted strings with `\`
//! escapes, `#` comments, and `include` (with globs, relative to the file
//! that includes it) expanded in place. Every directive keeps its file and
//! line, for what the importer says about it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One directive: `name args... ;` or `name args... { block }`.
#[derive(Debug, Clone, PartialEq)]
pub struct Directive {
    pub name: String,
    pub args: Vec<String>,
    /// `None` for a simple directive.
    pub block: Option<Vec<Directive>>,
    pub at: Place,
}

/// Where a directive was read: file and 1-based line.
#[derive(Debug, Clone, PartialEq)]
pub struct Place {
    pub file: Arc<Path>,
    pub line: usize,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// Why a config could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{at}: {message}")]
    Syntax { at: Place, message: String },
}

/// Nested includes deeper than this are refused (a file including itself).
const MAX_DEPTH: usize = 16;

/// Reads `path` and every file it includes.
pub fn read(path: &Path) -> Result<Vec<Directive>, ReadError> {
    read_file(path, 0)
}

fn read_file(path: &Path, depth: usize) -> Result<Vec<Directive>, ReadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReadError::Io {
        path: path.to_owned(),
        source,
    })?;
    let file: Arc<Path> = Arc::from(path);
    let tokens = tokenize(&text, &file)?;
    let mut at = 0;
    let directives = parse_block(&tokens, &mut at, &file, false)?;
    expand(directives, path, depth)
}

/// Replaces each `include` by the directives of the files it names.
fn expand(
    directives: Vec<Directive>,
    path: &Path,
    depth: usize,
) -> Result<Vec<Directive>, ReadError> {
    let mut out = Vec::with_capacity(directives.len());
    for mut d in directives {
        if d.name == "include" && d.block.is_none() {
            if depth >= MAX_DEPTH {
                return Err(ReadError::Syntax {
                    at: d.at,
                    message: format!("includes nested deeper than {MAX_DEPTH}"),
                });
            }
            let [pattern] = d.args.as_slice() else {
                return Err(ReadError::Syntax {
                    at: d.at,
                    message: "include takes one file or glob".into(),
                });
            };
            let base = path.parent().unwrap_or(Path::new("."));
            let full = base.join(pattern);
            let pattern_text = full.to_string_lossy().into_owned();
            let mut files: Vec<PathBuf> = match glob::glob(&pattern_text) {
                Ok(paths) => paths.filter_map(Result::ok).collect(),
                Err(e) => {
                    return Err(ReadError::Syntax {
                        at: d.at,
                        message: format!("bad include pattern: {e}"),
                    })
                }
            };
            files.sort();
            let has_glob = pattern.contains(['*', '?', '[']);
            if files.is_empty() && !has_glob {
                return Err(ReadError::Io {
                    path: full,
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "included file not found",
                    ),
                });
            }
            for f in files {
                out.extend(read_file(&f, depth + 1)?);
            }
            continue;
        }
        if let Some(block) = d.block.take() {
            d.block = Some(expand(block, path, depth)?);
        }
        out.push(d);
    }
    Ok(out)
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Semi,
    Open,
    Close,
}

fn tokenize(text: &str, file: &Arc<Path>) -> Result<Vec<(Tok, usize)>, ReadError> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    let err = |line: usize, message: &str| ReadError::Syntax {
        at: Place {
            file: file.clone(),
            line,
        },
        message: message.to_owned(),
    };
    while let Some(&c) = chars.peek() {
        match c {
            '\n' => {
                line += 1;
                chars.next();
            }
            c if c.is_whitespace() => {
                chars.next();
            }
            '#' => {
                while chars.peek().is_some_and(|&c| c != '\n') {
                    chars.next();
                }
            }
            ';' => {
                out.push((Tok::Semi, line));
                chars.next();
            }
            '{' => {
                out.push((Tok::Open, line));
                chars.next();
            }
            '}' => {
                out.push((Tok::Close, line));
                chars.next();
            }
            '"' | '\'' => {
                let quote = c;
                let start = line;
                chars.next();
                let mut word = String::new();
                loop {
                    match chars.next() {
                        None => return Err(err(start, "unterminated quoted string")),
                        Some('\\') => match chars.next() {
                            Some('n') => word.push('\n'),
                            Some('t') => word.push('\t'),
                            Some('r') => word.push('\r'),
                            Some(q) if q == quote || q == '\\' => word.push(q),
                            Some(other) => {
                                // nginx keeps unknown escapes as written.
                                word.push('\\');
                                word.push(other);
                                if other == '\n' {
                                    line += 1;
                                }
                            }
                            None => return Err(err(start, "unterminated quoted string")),
                        },
                        Some(c) if c == quote => break,
                        Some(c) => {
                            if c == '\n' {
                                line += 1;
                            }
                            word.push(c);
                        }
                    }
                }
                out.push((Tok::Word(word), start));
            }
            _ => {
                let mut word = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || matches!(c, ';' | '{' | '}') {
                        break;
                    }
                    // `${var}` keeps its braces inside a word.
                    if c == '$' {
                        word.push(c);
                        chars.next();
                        if chars.peek() == Some(&'{') {
                            for c in chars.by_ref() {
                                word.push(c);
                                if c == '}' {
                                    break;
                                }
                            }
                        }
                        continue;
                    }
                    if c == '\\' {
                        chars.next();
                        if let Some(n) = chars.next() {
                            word.push(n);
                        }
                        continue;
                    }
                    word.push(c);
                    chars.next();
                }
                out.push((Tok::Word(word), line));
            }
        }
    }
    Ok(out)
}

fn parse_block(
    tokens: &[(Tok, usize)],
    at: &mut usize,
    file: &Arc<Path>,
    nested: bool,
) -> Result<Vec<Directive>, ReadError> {
    let place = |line: usize| Place {
        file: file.clone(),
        line,
    };
    let mut out = Vec::new();
    while *at < tokens.len() {
        let (tok, line) = &tokens[*at];
        match tok {
            Tok::Close if nested => {
                *at += 1;
                return Ok(out);
            }
            Tok::Close => {
                return Err(ReadError::Syntax {
                    at: place(*line),
                    message: "unexpected \"}\"".into(),
                })
            }
            Tok::Semi | Tok::Open => {
                return Err(ReadError::Syntax {
                    at: place(*line),
                    message: format!(
                        "unexpected \"{}\"",
                        if *tok == Tok::Semi { ";" } else { "{" }
                    ),
                })
            }
            Tok::Word(name) => {
                let line = *line;
                *at += 1;
                let mut args = Vec::new();
                loop {
                    match tokens.get(*at) {
                        Some((Tok::Word(w), _)) => {
                            args.push(w.clone());
                            *at += 1;
                        }
                        Some((Tok::Semi, _)) => {
                            *at += 1;
                            out.push(Directive {
                                name: name.clone(),
                                args,
                                block: None,
                                at: place(line),
                            });
                            break;
                        }
                        Some((Tok::Open, _)) => {
                            *at += 1;
                            let block = parse_block(tokens, at, file, true)?;
                            out.push(Directive {
                                name: name.clone(),
                                args,
                                block: Some(block),
                                at: place(line),
                            });
                            break;
                        }
                        Some((Tok::Close, l)) => {
                            return Err(ReadError::Syntax {
                                at: place(*l),
                                message: format!("directive \"{name}\" is not terminated by \";\""),
                            })
                        }
                        None => {
                            return Err(ReadError::Syntax {
                                at: place(line),
                                message: format!("unexpected end of file after \"{name}\""),
                            })
                        }
                    }
                }
            }
        }
    }
    if nested {
        let line = tokens.last().map_or(1, |t| t.1);
        return Err(ReadError::Syntax {
            at: place(line),
            message: "unexpected end of file, expecting \"}\"".into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<Directive>, ReadError> {
        let file: Arc<Path> = Arc::from(Path::new("t.conf"));
        let tokens = tokenize(text, &file)?;
        parse_block(&tokens, &mut 0, &file, false)
    }

    #[test]
    fn directives_blocks_quotes_comments_and_lines() {
        let d = parse(
            "worker_processes 2; # two\nhttp {\n  log_format main '$remote_addr \"$request\"';\n  server { listen 80; return 200 \"a;b\\n\"; }\n}\n",
        )
        .unwrap();
        assert_eq!(d[0].name, "worker_processes");
        assert_eq!(d[0].args, ["2"]);
        let http = d[1].block.as_ref().unwrap();
        assert_eq!(d[1].at.line, 2);
        assert_eq!(http[0].args, ["main", "$remote_addr \"$request\""]);
        assert_eq!(http[0].at.line, 3);
        let server = http[1].block.as_ref().unwrap();
        assert_eq!(server[1].args, ["200", "a;b\n"]);
        assert_eq!(server[1].at.line, 4);
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let e = parse("http {\n  listen 80\n}\n").unwrap_err().to_string();
        assert!(e.starts_with("t.conf:3:"), "{e}");
        let e = parse("http {\n  server {\n").unwrap_err().to_string();
        assert!(e.contains("expecting \"}\""), "{e}");
        let e = parse("x \"open;\n").unwrap_err().to_string();
        assert!(e.starts_with("t.conf:1: unterminated"), "{e}");
    }

    #[test]
    fn includes_expand_globs_relative_to_the_including_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("conf.d")).unwrap();
        std::fs::write(
            dir.path().join("nginx.conf"),
            "http {\n  include conf.d/*.conf;\n  include none/*.conf;\n}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("conf.d/b.conf"), "server { listen 81; }\n").unwrap();
        std::fs::write(
            dir.path().join("conf.d/a.conf"),
            "\nserver { listen 80; }\n",
        )
        .unwrap();
        let d = read(&dir.path().join("nginx.conf")).unwrap();
        let http = d[0].block.as_ref().unwrap();
        assert_eq!(http.len(), 2);
        assert!(http[0].at.file.ends_with("conf.d/a.conf"));
        assert_eq!(http[0].at.line, 2);
        assert_eq!(http[1].block.as_ref().unwrap()[0].args, ["81"]);
        std::fs::write(dir.path().join("loop.conf"), "include loop.conf;\n").unwrap();
        assert!(read(&dir.path().join("loop.conf")).is_err());
    }
}
