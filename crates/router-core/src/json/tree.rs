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

/// One value, as read back from [`Nodes`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Node {
    pub(super) kind: Kind,
    pub(super) flags: u8,
    /// Where the value starts in the input.
    pub(super) start: u32,
    /// Where a scalar ends (containers do not keep it: nothing reads it).
    pub(super) end: u32,
    /// Index of the first node after this value's subtree.
    pub(super) after: u32,
}

impl Kind {
    #[inline]
    fn code(self) -> u8 {
        match self {
            Kind::Null => 0,
            Kind::Bool => 1,
            Kind::Num => 2,
            Kind::Str => 3,
            Kind::Arr => 4,
            Kind::Obj => 5,
        }
    }

    #[inline]
    fn from_code(c: u8) -> Kind {
        match c {
            0 => Kind::Null,
            1 => Kind::Bool,
            2 => Kind::Num,
            3 => Kind::Str,
            4 => Kind::Arr,
            _ => Kind::Obj,
        }
    }

    #[inline]
    fn is_container(self) -> bool {
        matches!(self, Kind::Arr | Kind::Obj)
    }
}

/// The values of a document in pre-order, 8 bytes each: the start offset, and one word
/// holding the kind and flags (top 6 bits) and a scalar's end or a container's `after`
/// (26 bits: documents are under 64 MiB). With values capped by [`Nodes::limit_for`], the
/// index of a body never exceeds twice its size.
pub(super) struct Nodes {
    /// `[start, tag << 26 | x]`: x is a scalar's end or a container's `after`.
    v: Vec<[u32; 2]>,
    limit: usize,
}

/// Bits of the second word that hold an offset or an index; documents are smaller.
pub(super) const OFFSET_BITS: u32 = 26;
const OFFSET_MASK: u32 = (1 << OFFSET_BITS) - 1;

impl Nodes {
    /// Room for a document of `len` bytes.
    pub(super) fn for_document(len: usize) -> Nodes {
        let limit = Self::limit_for(len);
        Nodes {
            // Reserved whole, never grown: no old-plus-new copy while growing, and memory
            // pages are backed only as values are written.
            v: Vec::with_capacity(limit),
            limit,
        }
    }

    /// Values a document of `len` bytes may hold: one per 4 bytes (token-id prompts
    /// average 5-7 bytes a value; prose and code far more), plus room for small bodies.
    /// At 8 bytes a value, the index stays within 2x the body.
    pub(super) fn limit_for(len: usize) -> usize {
        len / 4 + 4096
    }

    pub(super) fn len(&self) -> usize {
        self.v.len()
    }

    /// The most values this document may hold.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// Appends a value (the caller checked the limit); a container's `after` is set when
    /// it closes.
    #[inline]
    pub(super) fn push(&mut self, kind: Kind, flags: u8, start: u32, end: u32) -> usize {
        let i = self.v.len();
        let tag = u32::from(kind.code() | flags << 3);
        self.v.push([start, tag << OFFSET_BITS | end]);
        i
    }

    /// A container closed: the next value's index is `after`.
    pub(super) fn close(&mut self, i: usize, after: u32) {
        let w = &mut self.v[i][1];
        *w = (*w & !OFFSET_MASK) | after;
    }

    #[inline]
    pub(super) fn get(&self, i: usize) -> Node {
        let [start, w] = self.v[i];
        let tag = (w >> OFFSET_BITS) as u8;
        let x = w & OFFSET_MASK;
        let kind = Kind::from_code(tag & 7);
        if kind.is_container() {
            Node {
                kind,
                flags: tag >> 3,
                start,
                end: start,
                after: x,
            }
        } else {
            Node {
                kind,
                flags: tag >> 3,
                start,
                end: x,
                after: i as u32 + 1,
            }
        }
    }
}

/// Why a document was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ParseError {
    /// Not JSON: what was wrong, and the byte offset where it was found.
    Syntax { message: &'static str, at: usize },
    /// Valid so far, but more values where the router reads than [`Nodes::limit_for`]
    /// allows for a body this size.
    TooManyValues { limit: usize },
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::Syntax { message, at } => write!(f, "{message} at byte {at}"),
            ParseError::TooManyValues { limit } => {
                write!(
                    f,
                    "more than {limit} JSON values in the fields the router reads"
                )
            }
        }
    }
}

/// A string that does not decode to Unicode text (a lone surrogate escape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError(pub(crate) &'static str);
