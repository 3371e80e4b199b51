// Package certtest gives tests a private certificate authority: a CA made
// at test time and certificates it signs, written as PEM files into the
// test's temporary directory. No key is ever committed.
package certtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a test certificate authority.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// CertPEM is the CA certificate, and CertFile a file holding it.
	CertPEM  []byte
	CertFile string
}

// NewCA makes a CA named name and writes its certificate to a file.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("certtest: create CA: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("certtest: parse CA: %v", err)
	}
	ca := &CA{cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	ca.CertFile = filepath.Join(t.TempDir(), name+"-ca.pem")
	write(t, ca.CertFile, ca.CertPEM)
	return ca
}

// Pool is a cert pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Cert is a certificate the CA signed and its key.
type Cert struct {
	CertPEM, KeyPEM []byte
	// Serial tells certificates apart.
	Serial *big.Int
}

// Issue signs a certificate for server and client use, named cn and valid
// for the hosts given (DNS names or IP addresses).
func (ca *CA) Issue(t testing.TB, cn string, hosts ...string) Cert {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("certtest: issue %s: %v", cn, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("certtest: marshal key: %v", err)
	}
	return Cert{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
		Serial:  tmpl.SerialNumber,
	}
}

// Write writes the certificate and key to certFile and keyFile, replacing
// them the way a certificate manager does (write aside, then rename).
func (c Cert) Write(t testing.TB, certFile, keyFile string) {
	t.Helper()
	write(t, certFile, c.CertPEM)
	write(t, keyFile, c.KeyPEM)
}

// Files writes the certificate and key into a fresh directory and returns
// their paths.
func (c Cert) Files(t testing.TB) (certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	c.Write(t, certFile, keyFile)
	return certFile, keyFile
}

// TLS is the certificate as a tls.Certificate.
func (c Cert) TLS(t testing.TB) tls.Certificate {
	t.Helper()
	pair, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		t.Fatalf("certtest: %v", err)
	}
	return pair
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("certtest: generate key: %v", err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	if err != nil {
		t.Fatalf("certtest: serial: %v", err)
	}
	return n
}

func write(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatalf("certtest: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("certtest: %v", err)
	}
}
