//! Reading `server/src/**/*.rs` as far as imports go: the module tree (`mod` declarations, files
//! and inline modules), and every path that names another module of the crate (`use` trees, and
//! `crate::`, `super::`, `self::` paths written inline), resolved to the file that defines what
//! it names. A real parser would be a dependency for one test; Rust's module syntax is regular
//! enough that tokens with comments and literals blanked out are all it takes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A module: the crate root it hangs from (`lib.rs` or `main.rs`) and its path below it.
pub type ModulePath = (String, Vec<String>);

/// One source file and what it holds.
#[derive(Debug)]
pub struct SourceFile {
    /// The path relative to the crate's directory (`src/api/chat.rs`).
    pub path: String,
    /// The module the file holds.
    pub module: ModulePath,
    /// Every path the file names, in the module it names it from, with the line it is on.
    pub paths: Vec<NamedPath>,
    /// Every `use` binding, as the name it binds in its module and the path it binds.
    pub bindings: Vec<Binding>,
}

/// A path as written, with where it was written.
#[derive(Debug, Clone)]
pub struct NamedPath {
    /// The module whose scope the path is in (an inline module's, inside one).
    pub scope: ModulePath,
    /// The segments, `crate`, `super` and `self` included.
    pub segments: Vec<String>,
    /// 1-based line of the path's first segment.
    pub line: usize,
    /// Written in a `use` item, where a leading plain name may be a child module.
    pub in_use: bool,
}

/// A name a `use` item brings into a module.
#[derive(Debug, Clone)]
pub struct Binding {
    /// The module it binds in.
    pub scope: ModulePath,
    /// The name (the alias, or the path's last segment).
    pub name: String,
    /// The path it binds.
    pub path: NamedPath,
}

/// The crate's files and modules.
#[derive(Debug, Default)]
pub struct Crate {
    /// The files, in the order they were found.
    pub files: Vec<SourceFile>,
    /// Every module, file-backed or inline, and the index of the file it is in.
    pub modules: BTreeMap<ModulePath, usize>,
}

impl Crate {
    /// Reads the crate whose `src/` is `src`, from its roots `lib.rs` and `main.rs`.
    pub fn read(src: &Path) -> Crate {
        let mut krate = Crate::default();
        for root in ["lib.rs", "main.rs"] {
            let path = src.join(root);
            if path.exists() {
                krate.read_file(src, &path, (root.to_owned(), Vec::new()), src.to_path_buf());
            }
        }
        krate
    }

    /// Reads one file of module `module`, whose child modules' files are under `dir`, and the
    /// files its `mod` declarations name.
    fn read_file(&mut self, src: &Path, path: &Path, module: ModulePath, dir: PathBuf) {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{} is readable: {e}", path.display()));
        let index = self.files.len();
        let relative = path.strip_prefix(src.parent().unwrap_or(src)).unwrap_or(path);
        self.files.push(SourceFile {
            path: relative.display().to_string(),
            module: module.clone(),
            paths: Vec::new(),
            bindings: Vec::new(),
        });
        self.modules.insert(module.clone(), index);
        let scanned = scan(&text, &module);
        for inline in &scanned.inline_modules {
            self.modules.insert(inline.clone(), index);
        }
        self.files[index].paths = scanned.paths;
        self.files[index].bindings = scanned.bindings;
        for declared in scanned.declared {
            // An inline module's children live in a folder of its name.
            let below: PathBuf = declared.1[module.1.len()..declared.1.len() - 1].iter().collect();
            let name = declared.1.last().cloned().unwrap_or_default();
            let base = dir.join(below);
            let file =
                [base.join(format!("{name}.rs")), base.join(&name).join("mod.rs")].into_iter().find(|f| f.exists());
            if let Some(file) = file {
                let child_dir = base.join(&name);
                self.read_file(src, &file, declared, child_dir);
            }
        }
    }

    /// The file a path written in `scope` resolves to: the deepest module it names, or, where it
    /// goes on to an item that module imports rather than defines, the file that import names.
    /// `None` for paths outside the crate.
    pub fn resolve(&self, path: &NamedPath) -> Option<usize> {
        self.resolve_depth(path, 0)
    }

    fn resolve_depth(&self, path: &NamedPath, depth: usize) -> Option<usize> {
        let (module, item) = self.module_of(path)?;
        let file = *self.modules.get(&module)?;
        let Some(item) = item.filter(|_| depth < 8) else { return Some(file) };
        // An item the module imports is defined where the import points.
        let binding = self.files[file].bindings.iter().find(|b| b.scope == module && b.name == item);
        Some(binding.and_then(|b| self.resolve_depth(&b.path, depth + 1)).unwrap_or(file))
    }

    /// The deepest module `path` names, and the segment after it, if any.
    fn module_of(&self, path: &NamedPath) -> Option<(ModulePath, Option<String>)> {
        let (root, scope) = (&path.scope.0, &path.scope.1);
        let mut segments = path.segments.iter().peekable();
        let mut module: Vec<String> = match segments.peek().map(|s| s.as_str()) {
            Some("crate") => {
                segments.next();
                Vec::new()
            }
            Some("self") => {
                segments.next();
                scope.clone()
            }
            Some("super") => {
                let mut module = scope.clone();
                while segments.peek().map(|s| s.as_str()) == Some("super") {
                    segments.next();
                    module.pop()?;
                }
                module
            }
            // In a `use` item, a plain first name is a child module or an external crate.
            Some(first) if path.in_use => {
                let mut child = scope.clone();
                child.push(first.to_owned());
                if !self.modules.contains_key(&(root.clone(), child)) {
                    return None;
                }
                scope.clone()
            }
            _ => return None,
        };
        for segment in segments {
            let mut child = module.clone();
            child.push(segment.clone());
            if !self.modules.contains_key(&(root.clone(), child.clone())) {
                return Some(((root.clone(), module), Some(segment.clone())));
            }
            module = child;
        }
        Some(((root.clone(), module), None))
    }
}

/// What one file's tokens hold.
#[derive(Debug, Default)]
pub struct Scanned {
    /// Modules declared with `mod name;`, whose text is in another file.
    pub declared: Vec<ModulePath>,
    /// Modules written inline, `mod name { ... }`.
    pub inline_modules: Vec<ModulePath>,
    /// The paths named (see [`SourceFile::paths`]).
    pub paths: Vec<NamedPath>,
    /// The `use` bindings (see [`SourceFile::bindings`]).
    pub bindings: Vec<Binding>,
}

/// A token and its 1-based line.
type Token = (String, usize);

/// Scans a file of module `module`.
pub fn scan(text: &str, module: &ModulePath) -> Scanned {
    let tokens = tokenize(&blank_comments_and_literals(text));
    let mut scanned = Scanned::default();
    // Inline modules open, with the brace depth inside them.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    let scope = |inline: &[(String, usize)]| -> ModulePath {
        let mut path = module.1.clone();
        path.extend(inline.iter().map(|(name, _)| name.clone()));
        (module.0.clone(), path)
    };
    while i < tokens.len() {
        let token = tokens[i].0.as_str();
        let next = |k: usize| tokens.get(i + k).map_or("", |t| t.0.as_str());
        match token {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d > depth) {
                    inline.pop();
                }
            }
            "mod" if is_ident(next(1)) && next(2) == ";" => {
                let (root, mut path) = scope(&inline);
                path.push(next(1).to_owned());
                scanned.declared.push((root, path));
                i += 3;
                continue;
            }
            "mod" if is_ident(next(1)) && next(2) == "{" => {
                inline.push((next(1).to_owned(), depth + 1));
                scanned.inline_modules.push(scope(&inline));
                depth += 1;
                i += 3;
                continue;
            }
            "use" => {
                let end = tokens[i..].iter().position(|t| t.0 == ";").map_or(tokens.len(), |p| i + p);
                let here = scope(&inline);
                for (segments, name, line) in use_tree(&tokens[i + 1..end]) {
                    let path = NamedPath { scope: here.clone(), segments, line, in_use: true };
                    if let Some(name) = name {
                        scanned.bindings.push(Binding { scope: here.clone(), name, path: path.clone() });
                    }
                    scanned.paths.push(path);
                }
                i = end + 1;
                continue;
            }
            "crate" | "super" | "self" if next(1) == "::" && i.checked_sub(1).is_none_or(|p| tokens[p].0 != "::") => {
                let line = tokens[i].1;
                let mut segments = vec![token.to_owned()];
                let mut k = i + 1;
                while tokens.get(k).is_some_and(|t| t.0 == "::") && tokens.get(k + 1).is_some_and(|t| is_ident(&t.0)) {
                    segments.push(tokens[k + 1].0.clone());
                    k += 2;
                }
                scanned.paths.push(NamedPath { scope: scope(&inline), segments, line, in_use: false });
                i = k;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    scanned
}

/// The paths of a `use` tree (the tokens between `use` and `;`), each with the name it binds
/// (`None` for a glob) and its line.
fn use_tree(tokens: &[Token]) -> Vec<(Vec<String>, Option<String>, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    use_subtree(tokens, &mut at, &[], &mut out);
    out
}

fn use_subtree(
    tokens: &[Token],
    at: &mut usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, Option<String>, usize)>,
) {
    let mut path = prefix.to_vec();
    let line = tokens.get(*at).map_or(0, |t| t.1);
    while let Some((token, _)) = tokens.get(*at) {
        match token.as_str() {
            "{" => {
                *at += 1;
                loop {
                    match tokens.get(*at).map(|t| t.0.as_str()) {
                        None => return,
                        Some("}") => {
                            *at += 1;
                            return;
                        }
                        Some(_) => use_subtree(tokens, at, &path, out),
                    }
                    if tokens.get(*at).is_some_and(|t| t.0 == ",") {
                        *at += 1;
                    }
                }
            }
            "*" => {
                *at += 1;
                out.push((path, None, line));
                return;
            }
            "as" => {
                let alias = tokens.get(*at + 1).map(|t| t.0.clone());
                *at += 2;
                out.push((path, alias.filter(|a| a != "_"), line));
                return;
            }
            "," | "}" => break,
            // `a::{self, B}`: `self` names the prefix itself.
            "self" if !path.is_empty() => *at += 1,
            name if is_ident(name) => {
                path.push(name.to_owned());
                *at += 1;
            }
            _ => *at += 1,
        }
    }
    if !path.is_empty() {
        let name = path.last().cloned();
        out.push((path, name, line));
    }
}

fn is_ident(token: &str) -> bool {
    token.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && token.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// Identifiers, `::`, and every other character but `#` as a token.
fn tokenize(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut chars = text.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c == '\n' {
            line += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let mut end = start + c.len_utf8();
            while let Some(&(i, d)) = chars.peek().filter(|(_, d)| d.is_alphanumeric() || *d == '_') {
                end = i + d.len_utf8();
                chars.next();
            }
            tokens.push((text[start..end].to_owned(), line));
        } else if c == ':' && chars.peek().is_some_and(|&(_, d)| d == ':') {
            chars.next();
            tokens.push(("::".to_owned(), line));
        } else if !c.is_whitespace() && c != '#' {
            tokens.push((c.to_string(), line));
        }
    }
    tokens
}

/// The text with comments, string literals and character literals replaced by spaces (newlines
/// kept, so lines still count), so that what they spell is not taken for code.
pub fn blank_comments_and_literals(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for b in &mut out[from..to.min(bytes.len())] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    };
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&b| b == b'\n').map_or(bytes.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let (mut nesting, mut j) = (0usize, i);
            while j < bytes.len() {
                if bytes[j..].starts_with(b"/*") {
                    nesting += 1;
                    j += 2;
                } else if bytes[j..].starts_with(b"*/") {
                    nesting -= 1;
                    j += 2;
                    if nesting == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if let Some(hashes) = raw_string_start(bytes, i) {
            // r"..", r#".."#, br".."
            let open = i + bytes[i..].iter().position(|&b| b == b'"').unwrap_or(0) + 1;
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let end = bytes[open..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(bytes.len(), |p| open + p + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if bytes[i] == b'\'' {
            // A character literal closes within a few bytes; a lifetime does not close.
            let j = if rest.get(1) == Some(&b'\\') {
                rest.iter().skip(2).position(|&b| b == b'\'').map(|p| i + 2 + p)
            } else {
                let width = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + width) == Some(&b'\'')).then_some(i + 1 + width)
            };
            match j {
                Some(j) => {
                    blank(&mut out, i, j + 1);
                    i = j + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The number of `#`s of a raw string literal starting at `i`, if one does.
fn raw_string_start(bytes: &[u8], i: usize) -> Option<usize> {
    if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
        return None;
    }
    let rest = bytes[i..].strip_prefix(b"b").unwrap_or(&bytes[i..]);
    let rest = rest.strip_prefix(b"r")?;
    let hashes = rest.iter().take_while(|&&b| b == b'#').count();
    (rest.get(hashes) == Some(&b'"')).then_some(hashes)
}
