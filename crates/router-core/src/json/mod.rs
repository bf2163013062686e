//! A validating JSON reader for the request path.
//!
//! It checks the whole body in one pass (grammar, escapes, control characters, UTF-8) and
//! records every value as a span of the input, without copying or unescaping anything. A
//! 150 KB prompt is scanned 32 bytes at a time for the three bytes that end a plain run (`"`,
//! `\`, control characters); strings remember whether they hold an escape that the canonical
//! form spells differently (`\uXXXX`, `\/`), so nearly every string is later copied as is.
//!
//! Canonical forms match serde_json's writer byte for byte (compact, keys sorted, the same
//! escapes), so fingerprints do not change with this reader; `tests/canon_reference.rs`
//! checks that against the serde_json implementation this replaced.

mod document;
mod scanner;
mod strings;
mod tree;

pub(crate) use document::{Doc, Val};
pub(crate) use tree::{DecodeError, Kind, ParseError};

#[cfg(test)]
mod tests {
    use super::*;

    fn canon_json(s: &str) -> Result<String, String> {
        let d = Doc::parse(s.as_bytes()).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        d.root()
            .write_json(&mut out, &[])
            .map_err(|e| e.0.to_owned())?;
        Ok(String::from_utf8(out).unwrap())
    }

    fn serde_canon(s: &str) -> Result<String, String> {
        let v: serde_json::Value = serde_json::from_str(s).map_err(|e| e.to_string())?;
        Ok(serde_json::to_string(&v).unwrap())
    }

    #[test]
    fn canonical_json_matches_serde() {
        for s in [
            r#"{"b":1,"a":[true,false,null],"c":{"z":"x","y":-2.5e3}}"#,
            r#" { "a" : 1 , "a" : 2 } "#,
            r#"{"\u0062":1,"a":2,"b\"":3}"#,
            r#""a\/b\u00e9\u0001\n\"\\ \ud83d\ude00""#,
            r#"[0, -0, 1.0, 1e2, 12345678901234567890, 99999999999999999999999, -7]"#,
            r#"{"k":"\u2028\u007f"}"#,
            "[]",
            "{}",
        ] {
            assert_eq!(canon_json(s), serde_canon(s), "{s}");
        }
    }

    #[test]
    fn syntax_errors() {
        for s in [
            "",
            " ",
            "{",
            "[1,]",
            "{\"a\"}",
            "{\"a\":}",
            "01",
            "1.",
            "1e",
            "-",
            "tru",
            "nul",
            "\"abc",
            "\"\\x\"",
            "\"\\u12\"",
            "\"a\u{1}b\"",
            "[1] x",
            "{'a':1}",
            "{\"a\":1,}",
        ] {
            assert!(Doc::parse(s.as_bytes()).is_err(), "{s:?}");
            assert!(
                serde_json::from_str::<serde_json::Value>(s).is_err(),
                "serde accepts {s:?}"
            );
        }
        assert!(Doc::parse(b"\"\xff\"").is_err());
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(Doc::parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn lone_surrogates_do_not_decode() {
        for s in [r#""\ud800""#, r#""\udc00""#, r#""\ud800\u0041""#] {
            let d = Doc::parse(s.as_bytes()).unwrap();
            assert!(d.root().text().is_err(), "{s}");
            assert!(serde_json::from_str::<String>(s).is_err());
        }
    }

    #[test]
    fn bad_bytes_are_found_at_any_offset() {
        // Blocks, windows after quiet blocks, and the tail each see the bad byte somewhere.
        for len in [
            1usize, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 200, 300, 511,
        ] {
            for pos in [0, 1, len / 3, len / 2, len - 1] {
                for lead in ["", "x\\n", "\\t\\\"y"] {
                    let mut b = format!("[\"{lead}{}\", 1]", "a".repeat(len)).into_bytes();
                    let at = 2 + lead.len() + pos;
                    assert!(Doc::parse(&b).is_ok());
                    b[at] = 0xff;
                    assert!(Doc::parse(&b).is_err(), "0xff at {pos} of {len}");
                    b[at] = 0x01;
                    assert!(Doc::parse(&b).is_err(), "0x01 at {pos} of {len}");
                    b[at] = 0xc3; // a lead byte with no continuation
                    assert!(Doc::parse(&b).is_err(), "lone lead at {pos} of {len}");
                }
            }
        }
    }

    #[test]
    fn long_strings_cross_blocks() {
        for n in [0usize, 1, 31, 32, 33, 64, 100] {
            let s = format!("\"{}\\n{}é\"", "a".repeat(n), "b".repeat(n));
            let d = Doc::parse(s.as_bytes()).unwrap();
            assert_eq!(
                d.root().text().unwrap(),
                format!("{}\n{}é", "a".repeat(n), "b".repeat(n))
            );
        }
    }

    #[test]
    fn unwanted_members_are_validated_not_indexed() {
        let src = br#"{"metadata":[1,2,{"x":[3]}],"messages":[{"role":"user"}],"n":5}"#;
        let d = Doc::parse_members(src, &["messages", "model"]).unwrap();
        let keys: Vec<_> = d
            .root()
            .members()
            .map(|(k, _)| k.text().unwrap().into_owned())
            .collect();
        assert_eq!(keys, vec!["messages"]);
        let (_, m) = d.root().members().next().unwrap();
        assert_eq!(m.items().count(), 1);
        // Still validated: an error inside a skipped member is an error.
        for bad in [
            &br#"{"metadata":[1,,2],"messages":[]}"#[..],
            br#"{"metadata":"\x","messages":[]}"#,
            b"{\"metadata\":\"\xff\",\"messages\":[]}",
            br#"{"metadata":[1,2],"messages":[]"#,
        ] {
            assert!(Doc::parse_members(bad, &["messages"]).is_err(), "{bad:?}");
            assert!(serde_json::from_slice::<serde_json::Value>(bad).is_err());
        }
        // Escaped keys are kept (compared decoded later), nested members always.
        let d = Doc::parse_members(br#"{"m\u0065ssages":[],"x":{"y":1}}"#, &["messages"]).unwrap();
        assert_eq!(d.root().members().count(), 1);
    }

    #[test]
    fn values_are_capped_where_they_are_indexed_only() {
        let n = 200_000;
        let zeros = vec!["0"; n].join(",");
        // 400 KB of body, 200k values: over the cap (one per 4 bytes + 4096) when indexed...
        let indexed = format!(r#"{{"messages":[{zeros}]}}"#);
        match Doc::parse_members(indexed.as_bytes(), &["messages"]) {
            Err(ParseError::TooManyValues { limit }) => {
                assert_eq!(limit, indexed.len() / 4 + 4096)
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        // ...and free in a member nobody reads.
        let skipped = format!(r#"{{"metadata":[{zeros}],"messages":[]}}"#);
        assert!(Doc::parse_members(skipped.as_bytes(), &["messages"]).is_ok());
        // Token ids of four bytes each ("123,") fit.
        let ids = vec!["123"; n].join(",");
        assert!(
            Doc::parse_members(format!(r#"{{"prompt":[{ids}]}}"#).as_bytes(), &["prompt"]).is_ok()
        );
    }
}
