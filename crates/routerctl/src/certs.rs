//! `routerctl certs`: a cluster CA and one certificate per peer, like `cockroach cert
//! create-ca` / `create-node`. The CA is made once and reused, so peers added later get
//! certificates from the same CA; each peer's names and addresses go into its certificate's
//! subject alternative names, and it serves and calls with the same certificate.

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// Files written, for the report.
pub struct Made {
    /// Paths created now.
    pub created: Vec<PathBuf>,
    /// Paths kept as they were.
    pub kept: Vec<PathBuf>,
}

fn write_private(path: &Path, pem: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(pem.as_bytes())?;
    Ok(())
}

/// Makes (or reuses) `dir/ca.pem` + `dir/ca.key`, then for each `(name, sans)` makes
/// `dir/<name>.pem` + `dir/<name>.key` unless they exist (or `force`).
pub fn make(dir: &Path, nodes: &[(String, Vec<String>)], force: bool) -> anyhow::Result<Made> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut made = Made {
        created: Vec::new(),
        kept: Vec::new(),
    };
    let (ca_pem, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let issuer = if ca_pem.exists() && ca_key.exists() {
        let key = KeyPair::from_pem(&std::fs::read_to_string(&ca_key)?)
            .with_context(|| format!("reading {}", ca_key.display()))?;
        made.kept.extend([ca_pem.clone(), ca_key.clone()]);
        Issuer::from_ca_cert_pem(&std::fs::read_to_string(&ca_pem)?, key)
            .with_context(|| format!("reading {}", ca_pem.display()))?
    } else {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "router cluster CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let _ = std::fs::remove_file(&ca_pem);
        let _ = std::fs::remove_file(&ca_key);
        std::fs::write(&ca_pem, cert.pem())?;
        write_private(&ca_key, &key.serialize_pem())?;
        made.created.extend([ca_pem.clone(), ca_key.clone()]);
        Issuer::new(params, key)
    };
    for (name, sans) in nodes {
        let (pem, key_path) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        if !force && pem.exists() && key_path.exists() {
            made.kept.extend([pem, key_path]);
            continue;
        }
        let mut names = vec![name.clone()];
        names.extend(sans.iter().cloned());
        names.sort();
        names.dedup();
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("router peer {name}"));
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &issuer)?;
        let _ = std::fs::remove_file(&pem);
        let _ = std::fs::remove_file(&key_path);
        std::fs::write(&pem, cert.pem())?;
        write_private(&key_path, &key.serialize_pem())?;
        made.created.extend([pem, key_path]);
    }
    Ok(made)
}

/// `NAME[,SAN...]` as given on the command line.
pub fn parse_node(s: &str) -> anyhow::Result<(String, Vec<String>)> {
    let mut parts = s.split(',').map(str::trim).filter(|p| !p.is_empty());
    let name = parts
        .next()
        .ok_or_else(|| anyhow::anyhow!("--node needs NAME[,SAN...]"))?;
    if name.contains(['/', '\\']) || name.starts_with('.') {
        anyhow::bail!("node name '{name}' must be a plain file name");
    }
    Ok((name.to_owned(), parts.map(str::to_owned).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_ca_is_made_once_and_peers_get_their_names_in_the_sans() {
        let dir = std::env::temp_dir().join(format!("routerctl-certs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let nodes = vec![parse_node("router-1,10.0.0.1,r1.example").unwrap()];
        let first = make(&dir, &nodes, false).unwrap();
        assert_eq!(
            first.created.len(),
            4,
            "CA and one peer: {:?}",
            first.created
        );
        let ca = std::fs::read_to_string(dir.join("ca.pem")).unwrap();
        let mode = std::fs::metadata(dir.join("router-1.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let peer = std::fs::read_to_string(dir.join("router-1.pem")).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(peer.as_bytes()).unwrap();
        let x509 = pem.parse_x509().unwrap();
        let sans: Vec<String> = x509
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| format!("{n:?}"))
            .collect();
        let (_, ca_pem) = x509_parser::pem::parse_x509_pem(ca.as_bytes()).unwrap();
        let ca_x509 = ca_pem.parse_x509().unwrap();
        x509.verify_signature(Some(ca_x509.public_key()))
            .expect("signed by the cluster CA");
        for want in ["\"router-1\"", "\"r1.example\"", "IPAddress([10, 0, 0, 1])"] {
            assert!(
                sans.iter().any(|s| s.contains(want)),
                "{want} not in {sans:?}"
            );
        }
        // A second run adds a peer from the same CA and keeps the first peer's files.
        let more = vec![
            parse_node("router-1").unwrap(),
            parse_node("router-2,10.0.0.2").unwrap(),
        ];
        let second = make(&dir, &more, false).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("ca.pem")).unwrap(), ca);
        assert_eq!(
            std::fs::read_to_string(dir.join("router-1.pem")).unwrap(),
            peer
        );
        assert_eq!(second.created.len(), 2, "{:?}", second.created);
        // --force replaces the peer certificate, never the CA.
        make(&dir, &more[..1], true).unwrap();
        assert_ne!(
            std::fs::read_to_string(dir.join("router-1.pem")).unwrap(),
            peer
        );
        assert_eq!(std::fs::read_to_string(dir.join("ca.pem")).unwrap(), ca);
        assert!(parse_node("../evil").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
