//! TLS material made in the test: a self-signed certificate for the test address, and the
//! rustls configurations of a server that presents it and a client that trusts it.

use std::net::IpAddr;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// A server's certificate (self-signed, for one IP address) with its key.
#[derive(Debug)]
pub struct TestCert {
    /// The certificate, DER.
    pub der: CertificateDer<'static>,
    /// The certificate, PEM (for tonic).
    pub pem: String,
    /// The private key, PKCS#8 PEM (for tonic).
    pub key_pem: String,
    key_der: Vec<u8>,
}

impl TestCert {
    /// A new self-signed certificate whose subject alternative name is `ip`.
    pub fn for_ip(ip: IpAddr) -> TestCert {
        let made = rcgen::generate_simple_self_signed(vec![ip.to_string()])
            .expect("generate a self-signed certificate");
        TestCert {
            der: made.cert.der().clone(),
            pem: made.cert.pem(),
            key_pem: made.signing_key.serialize_pem(),
            key_der: made.signing_key.serialize_der(),
        }
    }

    /// A TLS server presenting this certificate.
    pub fn acceptor(&self) -> TlsAcceptor {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()));
        let config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![self.der.clone()], key)
            .expect("server TLS configuration");
        TlsAcceptor::from(Arc::new(config))
    }

    /// A TLS client that trusts this certificate (and nothing else).
    pub fn connector(&self) -> TlsConnector {
        let mut roots = RootCertStore::empty();
        roots
            .add(self.der.clone())
            .expect("trust the test certificate");
        let config = ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        TlsConnector::from(Arc::new(config))
    }
}
