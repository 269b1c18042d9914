//! Certificates for the TLS tests, made at run time (rcgen): a CA, a server certificate and a
//! client certificate it signed, and an unrelated CA that signed nothing here.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A CA, and a server certificate it signed for the names given; the CAs' certificates in PEM
/// files that anyone may read (what a client's CA option names), removed on drop.
pub struct TestCerts {
    /// The CA's certificate (PEM file): the one that signed the server's.
    pub ca_file: PathBuf,
    /// Another CA's certificate (PEM file): it signed nothing here.
    pub other_ca_file: PathBuf,
    /// The server's certificate, signed by the CA, for the names given (PEM).
    pub server_cert: String,
    /// The server's private key (PEM, PKCS #8, ECDSA P-256).
    pub server_key: String,
    /// A client certificate the CA signed (PEM file), for mutual TLS.
    pub client_cert_file: PathBuf,
    /// The client certificate's private key (PEM file, PKCS #8).
    pub client_key_file: PathBuf,
    /// Where the files are.
    _dir: tempfile::TempDir,
}

impl TestCerts {
    /// A fresh CA, a server certificate it signs for `names` (IP addresses become IP address
    /// names, anything else DNS names), a client certificate it signs, and another CA.
    pub fn new(names: &[&str]) -> TestCerts {
        let (ca_pem, issuer) = ca("fencing test CA");
        let (other_ca_pem, _) = ca("fencing test CA (another)");
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let common_name = names.first().map_or("server", String::as_str).to_owned();
        let (server_cert, server_key) = leaf(names, &common_name, &issuer);
        let (client_cert, client_key) = leaf(Vec::new(), "fencing test client", &issuer);
        let dir = tempfile::Builder::new().prefix("fencing-test-certs-").tempdir().unwrap();
        // The files must be readable by a server or a client run as another user.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let write = |name: &str, pem: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        TestCerts {
            ca_file: write("ca.pem", &ca_pem),
            other_ca_file: write("other-ca.pem", &other_ca_pem),
            client_cert_file: write("client.pem", &client_cert),
            client_key_file: write("client.key", &client_key),
            server_cert,
            server_key,
            _dir: dir,
        }
    }

    /// The server's certificate and key as the PEM files `server.pem` and `server.key` in
    /// `dir` (a server's own directory): their paths.
    pub fn write_server_files(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
        std::fs::write(&cert, &self.server_cert).unwrap();
        std::fs::write(&key, &self.server_key).unwrap();
        (cert, key)
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

/// A certificate `issuer` signs for `names`, named `common_name`: it and its key (PEM).
fn leaf(names: Vec<String>, common_name: &str, issuer: &Issuer<'static, KeyPair>) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(names).expect("valid names");
    params.distinguished_name.push(DnType::CommonName, common_name);
    (params.signed_by(&key, issuer).unwrap().pem(), key.serialize_pem())
}
