//! Reads a kernel's parameter list from OpenCL C source, to check a spec
//! against it without an OpenCL compiler (the coordinator has none).
//!
//! This is not a C parser. It removes comments and preprocessor lines, finds
//! every `__kernel void name(...)` (attributes allowed before `void` and
//! before the name), and classifies each parameter by address space, pointer
//! and type. Macros are not expanded, so a parameter whose type is a macro
//! or a typedef is reported as unsupported, with a message that says so; the
//! compiler on the agent remains the final judge.

use std::fmt;

use crate::scalar::ScalarType;

/// Where a parameter lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressSpace {
    /// `__global` / `global`.
    Global,
    /// `__local` / `local`.
    Local,
    /// `__constant` / `constant`.
    Constant,
    /// `__private` / `private`, or no qualifier.
    Private,
}

impl AddressSpace {
    /// The qualifier as written in sources (`__global`), empty for private.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressSpace::Global => "__global",
            AddressSpace::Local => "__local",
            AddressSpace::Constant => "__constant",
            AddressSpace::Private => "",
        }
    }

    fn from_word(word: &str) -> Option<AddressSpace> {
        match word {
            "__global" | "global" => Some(AddressSpace::Global),
            "__local" | "local" => Some(AddressSpace::Local),
            "__constant" | "constant" => Some(AddressSpace::Constant),
            "__private" | "private" => Some(AddressSpace::Private),
            _ => None,
        }
    }
}

/// A parameter's type (a scalar's type or a pointer's element type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamType {
    /// A type Starling can pass.
    Known(ScalarType),
    /// A type Starling cannot pass, or a parameter it could not read.
    Unsupported {
        /// The type (or parameter) as written.
        text: String,
        /// Why it cannot be passed, and what to write instead.
        reason: String,
    },
}

/// One kernel parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// Its name (empty in a prototype that omits it).
    pub name: String,
    /// Its address space.
    pub space: AddressSpace,
    /// Whether it is a pointer.
    pub pointer: bool,
    /// Its type, or its element type for a pointer.
    pub ty: ParamType,
}

impl Param {
    /// The parameter's type as people write it: `__global float*`, `uint`.
    pub fn type_text(&self) -> String {
        let mut text = String::new();
        if self.space != AddressSpace::Private {
            text.push_str(self.space.as_str());
            text.push(' ');
        }
        match &self.ty {
            ParamType::Known(ty) => text.push_str(ty.as_str()),
            ParamType::Unsupported { text: written, .. } => text.push_str(written),
        }
        if self.pointer {
            text.push('*');
        }
        text
    }
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.type_text())?;
        if !self.name.is_empty() {
            write!(f, " {}", self.name)?;
        }
        Ok(())
    }
}

/// A kernel's declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSignature {
    /// The kernel's name.
    pub name: String,
    /// Its parameters, in order.
    pub params: Vec<Param>,
    /// Its `reqd_work_group_size` attribute, when it has one.
    pub reqd_work_group_size: Option<[u64; 3]>,
}

/// Why a kernel's declaration cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No kernel of that name.
    #[error("{}", not_found_message(kernel, available))]
    NotFound {
        /// The kernel looked for.
        kernel: String,
        /// The kernels the source declares.
        available: Vec<String>,
    },
    /// The declaration is there but cannot be read.
    #[error("cannot read the declaration of kernel `{kernel}` (line {line}): {detail}")]
    Malformed {
        /// The kernel.
        kernel: String,
        /// Its line, from 1.
        line: usize,
        /// What is wrong.
        detail: String,
    },
}

fn not_found_message(kernel: &str, available: &[String]) -> String {
    if available.is_empty() {
        format!(
            "the source declares no kernel named `{kernel}`, nor any other kernel (a kernel is `__kernel void {kernel}(...)`)"
        )
    } else {
        format!(
            "kernel `{kernel}` not found; the source declares: {}",
            available.join(", ")
        )
    }
}

/// The names of the kernels `source` declares, each once, in source order.
pub fn kernel_names(source: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for decl in scan(source) {
        if let Some(name) = decl.name {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// Reads the declaration of kernel `name` (its first, if it is declared twice).
pub fn find_kernel(source: &str, name: &str) -> Result<KernelSignature, SignatureError> {
    let decls = scan(source);
    match decls.iter().find(|decl| decl.name.as_deref() == Some(name)) {
        Some(decl) => decl.signature.clone(),
        None => Err(SignatureError::NotFound {
            kernel: name.to_owned(),
            available: kernel_names_of(&decls),
        }),
    }
}

/// The targets of the `#include` directives in `source`, as written.
pub fn includes(source: &str) -> Vec<String> {
    let stripped = strip_comments(source);
    logical_lines(&stripped)
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix('#')?.trim_start();
            let target = rest.strip_prefix("include")?;
            Some(target.trim().to_owned())
        })
        .collect()
}

fn kernel_names_of(decls: &[Decl]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for name in decls.iter().filter_map(|decl| decl.name.as_ref()) {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

/// One `__kernel` occurrence: its name when it could be read, and the result
/// of reading the rest.
struct Decl {
    name: Option<String>,
    signature: Result<KernelSignature, SignatureError>,
}

/// Replaces comments with spaces, keeping newlines so lines still count.
fn strip_comments(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'/' && bytes.get(i + 1) == Some(&b'/') {
            while i < bytes.len() && bytes[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if bytes[i] == b'/' && bytes.get(i + 1) == Some(&b'*') {
            out.extend_from_slice(b"  ");
            i += 2;
            // An unterminated comment runs to the end, as the compiler would
            // refuse it anyway.
            while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                out.push(if bytes[i] == b'\n' { b'\n' } else { b' ' });
                i += 1;
            }
            if i < bytes.len() {
                out.extend_from_slice(b"  ");
                i += 2;
            }
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    // Only whole comments were replaced, by ASCII, so the rest is still UTF-8;
    // the lossy conversion never replaces anything.
    String::from_utf8_lossy(&out).into_owned()
}

/// Physical lines joined where a line ends in a backslash.
fn logical_lines(text: &str) -> impl Iterator<Item = String> + '_ {
    let mut lines = text.split('\n');
    std::iter::from_fn(move || {
        let mut line = lines.next()?.to_owned();
        while line.trim_end().ends_with('\\') {
            match lines.next() {
                Some(next) => {
                    line.push(' ');
                    line.push_str(next);
                }
                None => break,
            }
        }
        Some(line)
    })
}

/// Blanks preprocessor lines (with their continuations), keeping newlines.
fn strip_directives(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_directive = false;
    for (index, line) in text.split('\n').enumerate() {
        if index > 0 {
            out.push('\n');
        }
        if in_directive || line.trim_start().starts_with('#') {
            in_directive = line.trim_end().ends_with('\\');
        } else {
            out.push_str(line);
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Number(String),
    Punct(u8),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    tok: Tok,
    line: usize,
}

impl Token {
    fn is_ident(&self, word: &str) -> bool {
        matches!(&self.tok, Tok::Ident(ident) if ident == word)
    }

    fn is_punct(&self, byte: u8) -> bool {
        self.tok == Tok::Punct(byte)
    }

    fn text(&self) -> String {
        match &self.tok {
            Tok::Ident(text) | Tok::Number(text) => text.clone(),
            Tok::Punct(byte) => char::from(*byte).to_string(),
        }
    }
}

fn tokenize(text: &str) -> Vec<Token> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte == b'\n' {
            line += 1;
            i += 1;
        } else if byte.is_ascii_whitespace() {
            i += 1;
        } else if byte.is_ascii_alphabetic() || byte == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            tokens.push(Token {
                tok: Tok::Ident(text[start..i].to_owned()),
                line,
            });
        } else if byte.is_ascii_digit() {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                i += 1;
            }
            tokens.push(Token {
                tok: Tok::Number(text[start..i].to_owned()),
                line,
            });
        } else {
            tokens.push(Token {
                tok: Tok::Punct(byte),
                line,
            });
            i += 1;
        }
    }
    tokens
}

/// The index just past the parenthesis that closes the one at `open`, if any.
fn matching_paren(tokens: &[Token], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (offset, token) in tokens.get(open..)?.iter().enumerate() {
        if token.is_punct(b'(') {
            depth += 1;
        } else if token.is_punct(b')') {
            depth = depth.checked_sub(1)?;
            if depth == 0 {
                return Some(open + offset + 1);
            }
        }
    }
    None
}

/// Reads `__attribute__((...))` starting at `at` (the `__attribute__`
/// token): the index after it, and a `reqd_work_group_size` inside it.
fn read_attribute(tokens: &[Token], at: usize) -> (usize, Option<[u64; 3]>) {
    let open = at + 1;
    if !tokens.get(open).is_some_and(|token| token.is_punct(b'(')) {
        return (open, None);
    }
    let Some(end) = matching_paren(tokens, open) else {
        return (tokens.len(), None);
    };
    let inner = &tokens[open..end];
    let reqd = inner
        .iter()
        .position(|token| token.is_ident("reqd_work_group_size"))
        .and_then(|pos| reqd_sizes(&inner[pos + 1..]));
    (end, reqd)
}

/// Parses `( X , Y , Z )` as three sizes.
fn reqd_sizes(tokens: &[Token]) -> Option<[u64; 3]> {
    let shape = [b'(', 0, b',', 0, b',', 0, b')'];
    let mut sizes = [0u64; 3];
    let mut next = 0;
    for (token, expected) in tokens.iter().zip(shape) {
        match (&token.tok, expected) {
            (Tok::Number(number), 0) => {
                let digits = number.trim_end_matches(['u', 'U', 'l', 'L']);
                *sizes.get_mut(next)? = digits.parse().ok()?;
                next += 1;
            }
            (Tok::Punct(byte), punct) if punct != 0 && *byte == punct => {}
            _ => return None,
        }
    }
    (next == 3).then_some(sizes)
}

fn scan(source: &str) -> Vec<Decl> {
    let text = strip_directives(&strip_comments(source));
    let tokens = tokenize(&text);
    let mut decls = Vec::new();
    let mut pending_reqd = None;
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i].is_ident("__attribute__") {
            let (next, reqd) = read_attribute(&tokens, i);
            pending_reqd = reqd.or(pending_reqd);
            i = next;
        } else if tokens[i].is_ident("__kernel") || tokens[i].is_ident("kernel") {
            let (decl, next) = read_kernel(&tokens, i, pending_reqd.take());
            decls.push(decl);
            i = next.max(i + 1);
        } else {
            pending_reqd = None;
            i += 1;
        }
    }
    decls
}

/// Reads the kernel declared at `at` (the `__kernel` token).
fn read_kernel(tokens: &[Token], at: usize, mut reqd: Option<[u64; 3]>) -> (Decl, usize) {
    let line = tokens[at].line;
    let mut i = at + 1;
    let mut seen_void = false;
    let name = loop {
        let Some(token) = tokens.get(i) else {
            return (unnamed(), i);
        };
        match &token.tok {
            Tok::Ident(word) if word == "__attribute__" => {
                let (next, found) = read_attribute(tokens, i);
                reqd = found.or(reqd);
                i = next;
            }
            Tok::Ident(word) if word == "void" && !seen_void => {
                seen_void = true;
                i += 1;
            }
            Tok::Ident(word) if seen_void => {
                i += 1;
                break word.clone();
            }
            // Not a kernel definition we can read (a kernel returning
            // something, or `kernel` used in a way we do not know); the
            // compiler will say what is wrong with it.
            _ => return (unnamed(), i),
        }
    };
    let malformed = |detail: &str| SignatureError::Malformed {
        kernel: name.clone(),
        line,
        detail: detail.to_owned(),
    };
    if !tokens.get(i).is_some_and(|token| token.is_punct(b'(')) {
        let decl = Decl {
            name: Some(name.clone()),
            signature: Err(malformed("expected `(` after the kernel's name")),
        };
        return (decl, i);
    }
    let Some(end) = matching_paren(tokens, i) else {
        let decl = Decl {
            name: Some(name.clone()),
            signature: Err(malformed("its parameter list is never closed")),
        };
        return (decl, tokens.len());
    };
    let params = read_params(&tokens[i + 1..end - 1]);
    let decl = Decl {
        name: Some(name.clone()),
        signature: Ok(KernelSignature {
            name,
            params,
            reqd_work_group_size: reqd,
        }),
    };
    (decl, end)
}

fn unnamed() -> Decl {
    Decl {
        name: None,
        signature: Err(SignatureError::NotFound {
            kernel: String::new(),
            available: Vec::new(),
        }),
    }
}

fn read_params(tokens: &[Token]) -> Vec<Param> {
    if tokens.is_empty() || (tokens.len() == 1 && tokens[0].is_ident("void")) {
        return Vec::new();
    }
    let mut params = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (index, token) in tokens.iter().enumerate() {
        match token.tok {
            Tok::Punct(b'(' | b'[') => depth += 1,
            Tok::Punct(b')' | b']') => depth = depth.saturating_sub(1),
            Tok::Punct(b',') if depth == 0 => {
                params.push(read_param(&tokens[start..index]));
                start = index + 1;
            }
            _ => {}
        }
    }
    params.push(read_param(&tokens[start..]));
    params
}

const IGNORED_QUALIFIERS: &[&str] = &[
    "const",
    "volatile",
    "restrict",
    "__restrict",
    "__read_only",
    "read_only",
    "__write_only",
    "write_only",
    "__read_write",
    "read_write",
];

/// C's type words that combine (`unsigned long int`).
const COMBINING: &[&str] = &["unsigned", "signed", "char", "short", "int", "long"];

fn read_param(tokens: &[Token]) -> Param {
    let written = join_tokens(tokens);
    let unreadable = |reason: String| Param {
        name: String::new(),
        space: AddressSpace::Private,
        pointer: false,
        ty: ParamType::Unsupported {
            text: written.clone(),
            reason,
        },
    };
    let mut space = None;
    let mut stars = 0usize;
    let mut type_words: Vec<String> = Vec::new();
    let mut name: Option<String> = None;
    let mut i = 0;
    while i < tokens.len() {
        let token = &tokens[i];
        match &token.tok {
            Tok::Ident(word) if word == "__attribute__" => {
                i = read_attribute(tokens, i).0;
                continue;
            }
            Tok::Ident(word) if AddressSpace::from_word(word).is_some() => {
                let found = AddressSpace::from_word(word);
                if space.is_some() && space != found {
                    return unreadable("it has two address spaces; keep one".to_owned());
                }
                space = found;
            }
            Tok::Ident(word) if IGNORED_QUALIFIERS.contains(&word.as_str()) => {}
            Tok::Ident(word)
                if name.is_none() && stars == 0 && takes_type_word(&type_words, word) =>
            {
                type_words.push(word.clone());
            }
            Tok::Ident(word) if name.is_none() => name = Some(word.clone()),
            Tok::Punct(b'*') if name.is_none() => stars += 1,
            Tok::Punct(b'[') => {
                return unreadable(
                    "array parameters are not supported; declare a __global pointer".to_owned(),
                );
            }
            _ => {
                return unreadable(format!("cannot read it at `{}`", token.text()));
            }
        }
        i += 1;
    }
    if type_words.is_empty() {
        return unreadable("it has no type".to_owned());
    }
    let type_text = type_words.join(" ");
    let ty = match resolve_type(&type_words) {
        Ok(ty) => ParamType::Known(ty),
        Err(reason) => ParamType::Unsupported {
            text: type_text,
            reason,
        },
    };
    let ty = if stars > 1 {
        ParamType::Unsupported {
            text: format!("{}{}", type_words.join(" "), "*".repeat(stars - 1)),
            reason: "pointers to pointers cannot be kernel arguments".to_owned(),
        }
    } else {
        ty
    };
    Param {
        name: name.unwrap_or_default(),
        space: space.unwrap_or(AddressSpace::Private),
        pointer: stars > 0,
        ty,
    }
}

/// Whether `word` continues the type being read rather than naming the parameter.
fn takes_type_word(type_words: &[String], word: &str) -> bool {
    match type_words.last() {
        None => true,
        Some(last) if matches!(last.as_str(), "struct" | "union" | "enum") => true,
        Some(_) => {
            COMBINING.contains(&word) && type_words.iter().all(|w| COMBINING.contains(&w.as_str()))
        }
    }
}

fn resolve_type(words: &[String]) -> Result<ScalarType, String> {
    if words.iter().all(|word| COMBINING.contains(&word.as_str())) {
        return resolve_combined(words);
    }
    let written = words.join(" ");
    let [word] = words else {
        return Err(format!(
            "`{written}` is not an OpenCL C scalar type Starling knows"
        ));
    };
    match word.as_str() {
        "uchar" => Ok(ScalarType::Uchar),
        "ushort" => Ok(ScalarType::Ushort),
        "uint" => Ok(ScalarType::Uint),
        "ulong" => Ok(ScalarType::Ulong),
        "float" => Ok(ScalarType::Float),
        "double" => Ok(ScalarType::Double),
        "size_t" | "ptrdiff_t" | "intptr_t" | "uintptr_t" => Err(format!(
            "`{word}` is 32 or 64 bits depending on the device, so its bytes cannot be fixed in advance; use uint or ulong"
        )),
        "half" => Err("`half` is not supported; use float (or ushort with vload_half)".to_owned()),
        "bool" => Err("OpenCL C does not allow `bool` kernel arguments; use int".to_owned()),
        "struct" | "union" | "enum" => Err(format!(
            "`{written}` arguments are not supported; pass the fields as separate arguments or buffers"
        )),
        other if vector_base(other).is_some() => Err(format!(
            "vector type `{other}` is not supported; pass a {} buffer and use vload/vstore",
            vector_base(other).unwrap_or(other)
        )),
        other if other.starts_with("image") || other == "sampler_t" || other == "event_t" || other == "pipe" => {
            Err(format!("`{other}` arguments are not supported; only scalars and buffers are"))
        }
        other => Err(format!(
            "unknown type `{other}` (macros and typedefs are not expanded when checking a spec; write the type itself, such as float or uint)"
        )),
    }
}

/// `float` for `float4` and the other vector types, `None` otherwise.
fn vector_base(word: &str) -> Option<&str> {
    let base = word.trim_end_matches(|c: char| c.is_ascii_digit());
    let width = &word[base.len()..];
    let bases = [
        "char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "float", "double",
        "half",
    ];
    (bases.contains(&base) && matches!(width, "2" | "3" | "4" | "8" | "16")).then_some(base)
}

fn resolve_combined(words: &[String]) -> Result<ScalarType, String> {
    let count = |name: &str| words.iter().filter(|word| *word == name).count();
    let (unsigned, signed) = (count("unsigned"), count("signed"));
    let (char, short, int, long) = (count("char"), count("short"), count("int"), count("long"));
    let written = words.join(" ");
    let invalid = || format!("`{written}` is not a valid OpenCL C type");
    if unsigned + signed > 1 || int > 1 || char + short + long > 1 {
        return Err(if long > 1 {
            format!("`{written}` is not an OpenCL C type; long is already 64 bits")
        } else {
            invalid()
        });
    }
    if char == 1 && int == 1 {
        return Err(invalid());
    }
    let unsigned = unsigned == 1;
    Ok(match (char, short, long, unsigned) {
        (1, _, _, false) => ScalarType::Char,
        (1, _, _, true) => ScalarType::Uchar,
        (_, 1, _, false) => ScalarType::Short,
        (_, 1, _, true) => ScalarType::Ushort,
        (_, _, 1, false) => ScalarType::Long,
        (_, _, 1, true) => ScalarType::Ulong,
        (_, _, _, false) => ScalarType::Int,
        (_, _, _, true) => ScalarType::Uint,
    })
}

fn join_tokens(tokens: &[Token]) -> String {
    let mut text = String::new();
    for token in tokens {
        let piece = token.text();
        let glue = matches!(token.tok, Tok::Punct(_))
            || text.ends_with(['*', '(', '['])
            || text.is_empty();
        if !glue {
            text.push(' ');
        }
        text.push_str(&piece);
    }
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn only(source: &str) -> KernelSignature {
        let names = kernel_names(source);
        assert_eq!(names.len(), 1, "{names:?}");
        find_kernel(source, &names[0]).unwrap()
    }

    fn known(space: AddressSpace, pointer: bool, ty: ScalarType, name: &str) -> Param {
        Param {
            name: name.into(),
            space,
            pointer,
            ty: ParamType::Known(ty),
        }
    }

    #[test]
    fn reads_saxpy() {
        let sig = only(
            "__kernel void saxpy(const uint n, const float a, __global const float *x, __global float * restrict y) {\n\
             uint i = get_global_id(0);\n if (i < n) y[i] = a * x[i] + y[i];\n}",
        );
        assert_eq!(sig.name, "saxpy");
        assert_eq!(
            sig.params,
            vec![
                known(AddressSpace::Private, false, ScalarType::Uint, "n"),
                known(AddressSpace::Private, false, ScalarType::Float, "a"),
                known(AddressSpace::Global, true, ScalarType::Float, "x"),
                known(AddressSpace::Global, true, ScalarType::Float, "y"),
            ]
        );
        assert_eq!(sig.reqd_work_group_size, None);
        assert_eq!(sig.params[2].to_string(), "__global float* x");
    }

    #[test]
    fn reads_spaces_qualifiers_and_c_type_names() {
        let sig = only(
            "kernel void k(global uchar* a, local unsigned int *b, constant short* c,\n\
             __private unsigned long d, signed char e, unsigned f, long int g, __read_only __global double* h,\n\
             unsigned short int i, int j, ulong k) {}",
        );
        let got: Vec<String> = sig.params.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "__global uchar* a",
                "__local uint* b",
                "__constant short* c",
                "ulong d",
                "char e",
                "uint f",
                "long g",
                "__global double* h",
                "ushort i",
                "int j",
                "ulong k"
            ]
        );
    }

    #[test]
    fn reads_attributes_before_and_after_kernel() {
        let before = only(
            "__attribute__((reqd_work_group_size(16, 16, 1)))\n__kernel void mm(__global float* c) {}",
        );
        assert_eq!(before.reqd_work_group_size, Some([16, 16, 1]));
        let after = only(
            "__kernel __attribute__((reqd_work_group_size(8,4,1))) void mm(__global float* c) {}",
        );
        assert_eq!(after.reqd_work_group_size, Some([8, 4, 1]));
        let other = only("__kernel __attribute__((vec_type_hint(float4))) void v(void) {}");
        assert_eq!(other.reqd_work_group_size, None);
        assert!(other.params.is_empty());
    }

    #[test]
    fn comments_and_directives_hide_kernels() {
        let source = "// __kernel void fake1(int a) {}\n\
                      /* __kernel void fake2(int a) {}\n  more */\n\
                      #define K __kernel void fake3(int a) \\\n  {}\n\
                      #pragma OPENCL EXTENSION cl_khr_fp64 : enable\n\
                      __kernel void real(int a /* , int b */) {}\n\
                      kernel void other(void) {}";
        assert_eq!(kernel_names(source), ["real", "other"]);
        assert_eq!(find_kernel(source, "real").unwrap().params.len(), 1);
        assert_eq!(
            find_kernel(source, "fake1").unwrap_err().to_string(),
            "kernel `fake1` not found; the source declares: real, other"
        );
        assert!(matches!(
            find_kernel("int main() {}", "k").unwrap_err(),
            SignatureError::NotFound { available, .. } if available.is_empty()
        ));
    }

    #[test]
    fn prototypes_count_once() {
        let source =
            "__kernel void k(__global int* a);\n__kernel void k(__global int* a) { a[0] = 1; }";
        assert_eq!(kernel_names(source), ["k"]);
    }

    #[test]
    fn unsupported_types_say_why() {
        let sig = only(
            "__kernel void k(size_t n, __global float4* v, MYREAL x, __global int** p, image2d_t img, int arr[4], half h) {}",
        );
        let reason = |i: usize| match &sig.params[i].ty {
            ParamType::Unsupported { reason, .. } => reason.clone(),
            other => panic!("param {i} is {other:?}"),
        };
        assert!(reason(0).contains("32 or 64 bits"), "{}", reason(0));
        assert!(reason(1).contains("vector type `float4`"), "{}", reason(1));
        assert!(sig.params[1].pointer);
        assert!(reason(2).contains("macros and typedefs"), "{}", reason(2));
        assert_eq!(sig.params[2].name, "x");
        assert!(reason(3).contains("pointers to pointers"), "{}", reason(3));
        assert!(reason(4).contains("image2d_t"), "{}", reason(4));
        assert!(reason(5).contains("array"), "{}", reason(5));
        assert!(reason(6).contains("half"), "{}", reason(6));
        assert_eq!(sig.params.len(), 7);
    }

    #[test]
    fn unclosed_parameter_list_is_malformed() {
        let err = find_kernel("\n__kernel void k(__global int* a {", "k").unwrap_err();
        assert!(
            matches!(&err, SignatureError::Malformed { line: 2, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("never closed"), "{err}");
    }

    #[test]
    fn includes_are_listed() {
        let source =
            "#include \"common.h\"\n// #include <hidden.h>\n  #  include <x.h>\nkernel void k() {}";
        assert_eq!(includes(source), ["\"common.h\"", "<x.h>"]);
        assert!(includes("kernel void k() {}").is_empty());
    }
}
