//! The reader's vocabulary: what a value is, the flat node each value becomes, and the two
//! kinds of error.

/// What a value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Null,
    Bool,
    Num,
    Str,
    Arr,
    Obj,
}

/// String flags.
pub(super) const ESCAPED: u8 = 1;
/// Holds `\uXXXX` or `\/`: the canonical spelling differs from the input.
pub(super) const DECODE: u8 = 2;
/// Number flag: digits only (no sign, fraction or exponent).
pub(super) const PLAIN_INT: u8 = 4;

#[derive(Debug, Clone, Copy)]
pub(super) struct Node {
    pub(super) kind: Kind,
    pub(super) flags: u8,
    /// Byte span of the value in the input.
    pub(super) start: u32,
    pub(super) end: u32,
    /// Index of the first node after this value's subtree.
    pub(super) after: u32,
}

/// A syntax error, with the byte offset where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub(crate) message: &'static str,
    pub(crate) at: usize,
}

impl std::fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.message, self.at)
    }
}

/// A string that does not decode to Unicode text (a lone surrogate escape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError(pub(crate) &'static str);
