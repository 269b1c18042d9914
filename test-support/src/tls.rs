//! Certificates for the TLS tests, made at run time (rcgen): a CA, a server certificate it
//! signed, and an unrelated CA that signed nothing here.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A CA and a server certificate it signed, for the names given; the CAs' certificates in PEM
/// files that anyone may read (what `sslrootcert` names), removed on drop.
pub struct TestCerts {
    /// The CA's certificate (PEM file): the one that signed the server's.
    pub ca_file: PathBuf,
    /// Another CA's certificate (PEM file): it signed nothing here.
    pub other_ca_file: PathBuf,
    /// The server's certificate, signed by the CA, for the names given (PEM).
    pub server_cert: String,
    /// The server's private key (PEM, PKCS #8, ECDSA P-256).
    pub server_key: String,
    /// Where the CA files are.
    _dir: tempfile::TempDir,
}

impl TestCerts {
    /// A fresh CA, a server certificate it signs for `names` (IP addresses become IP address
    /// names, anything else DNS names), and another CA.
    pub fn new(names: &[&str]) -> TestCerts {
        let (ca_pem, issuer) = ca("fencing test CA");
        let (other_ca_pem, _) = ca("fencing test CA (another)");
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("valid names");
        params.distinguished_name.push(DnType::CommonName, names.first().map_or("server", String::as_str));
        let server_cert = params.signed_by(&key, &issuer).unwrap().pem();
        let dir = tempfile::Builder::new().prefix("fencing-test-certs-").tempdir().unwrap();
        // The files must be readable by a server or a client run as another user.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let ca_file = dir.path().join("ca.pem");
        let other_ca_file = dir.path().join("other-ca.pem");
        std::fs::write(&ca_file, ca_pem).unwrap();
        std::fs::write(&other_ca_file, other_ca_pem).unwrap();
        TestCerts { ca_file, other_ca_file, server_cert, server_key: key.serialize_pem(), _dir: dir }
    }
}

/// A self-signed CA: its certificate (PEM), and what signs with it.
fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let pem = params.self_signed(&key).unwrap().pem();
    (pem, Issuer::new(params, key))
}
