// certcheck: an independent check, in Go's standard library only, of the files
// `spherecal certs` writes and of a coordinator's mutual TLS (issue #26).
//
//	go run tests/interop/certcheck.go -dir CERTS [-addr HOST:PORT]
//
// For every NAME.pem/NAME.key pair in CERTS: load it as a TLS key pair, parse the
// certificate with crypto/x509, verify it against ca.pem for its key usage, and
// for a participant certificate check the spherecal binding independently — the
// spiffe://spherecal/participant/ID URI names the CN, and the
// urn:spherecal:ed25519:HEX URI equals the public key in NAME.identity.key. With
// crl.pem present, parse it, check the CA's signature and report its CRL number
// and whether its authority key id names the CA. With -addr, call the
// standard gRPC health service (grpc.health.v1.Health/Check) over HTTP/2 with
// each client pair: a complete mutual-TLS handshake and a real gRPC response; with
// -reflect also, list the services over server reflection v1 and v1alpha.
//
// Prints one JSON object per checked item and exits 1 on the first failure.
package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

const (
	identityPrefix = "spiffe://spherecal/participant/"
	keyPrefix      = "urn:spherecal:ed25519:"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "certcheck: "+format+"\n", args...)
	os.Exit(1)
}

func report(fields map[string]interface{}) {
	out, _ := json.Marshal(fields)
	fmt.Println(string(out))
}

func readPEM(path, kind string) []byte {
	data, err := os.ReadFile(path)
	if err != nil {
		fail("%v", err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != kind {
		fail("%s: no %s PEM block", path, kind)
	}
	return block.Bytes
}

// namesKey says whether a CRL's authority key id is the key id ski. Go before 1.20
// keeps the extension's whole DER value there (SEQUENCE { [0] keyIdentifier }),
// later versions the key identifier alone: either form is accepted.
func namesKey(akid, ski []byte) bool {
	if len(ski) == 0 || len(ski) > 127 {
		return false
	}
	wrapped := append([]byte{0x30, byte(len(ski) + 2), 0x80, byte(len(ski))}, ski...)
	return bytes.Equal(akid, ski) || bytes.Equal(akid, wrapped)
}

// binding checks a participant certificate's id and identity-key URIs.
func binding(dir, name string, cert *x509.Certificate) (bool, error) {
	var ids, keys []string
	for _, u := range cert.URIs {
		s := u.String()
		switch {
		case strings.HasPrefix(s, identityPrefix):
			id, err := url.PathUnescape(strings.TrimPrefix(s, identityPrefix))
			if err != nil {
				return false, err
			}
			ids = append(ids, id)
		case strings.HasPrefix(s, keyPrefix):
			keys = append(keys, strings.TrimPrefix(s, keyPrefix))
		}
	}
	if len(keys) == 0 {
		return false, nil // not a participant certificate (the server's)
	}
	if len(ids) != 1 || ids[0] != cert.Subject.CommonName || len(keys) != 1 {
		return false, fmt.Errorf("ids %v keys %v for CN %q", ids, keys, cert.Subject.CommonName)
	}
	bound, err := hex.DecodeString(keys[0])
	if err != nil || len(bound) != ed25519.PublicKeySize {
		return false, fmt.Errorf("bad key URI %q", keys[0])
	}
	der := readPEM(filepath.Join(dir, name+".identity.key"), "PRIVATE KEY")
	priv, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return false, err
	}
	ed, ok := priv.(ed25519.PrivateKey)
	if !ok {
		return false, fmt.Errorf("%s.identity.key is not Ed25519", name)
	}
	if !bytes.Equal(ed.Public().(ed25519.PublicKey), bound) {
		return false, fmt.Errorf("certificate binds another key than %s.identity.key", name)
	}
	return true, nil
}

// grpcCall sends one gRPC message to path over HTTP/2 with a client key pair and
// returns the first response message (a unary call, or a stream that answers one
// message and ends when the client half-closes).
func grpcCall(addr, serverName, path string, roots *x509.CertPool, pair tls.Certificate, msg []byte) ([]byte, error) {
	config := &tls.Config{
		RootCAs:      roots,
		Certificates: []tls.Certificate{pair},
		ServerName:   serverName,
		NextProtos:   []string{"h2"},
		MinVersion:   tls.VersionTLS12,
	}
	client := &http.Client{
		Transport: &http.Transport{TLSClientConfig: config, ForceAttemptHTTP2: true},
		Timeout:   20 * time.Second,
	}
	// a gRPC message: uncompressed flag, 4-byte big-endian length, the protobuf bytes
	frame := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(msg)))
	frame = append(frame, msg...)
	req, err := http.NewRequest("POST", "https://"+addr+path, bytes.NewReader(frame))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	payload, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.ProtoMajor != 2 {
		return nil, fmt.Errorf("answered over HTTP/%d", resp.ProtoMajor)
	}
	if code := resp.Trailer.Get("Grpc-Status"); code != "0" {
		return nil, fmt.Errorf("grpc-status %q: %s", code, resp.Trailer.Get("Grpc-Message"))
	}
	if len(payload) < 5 || payload[0] != 0 {
		return nil, fmt.Errorf("bad gRPC response frame %x", payload)
	}
	n := int(payload[1])<<24 | int(payload[2])<<16 | int(payload[3])<<8 | int(payload[4])
	if len(payload) < 5+n {
		return nil, fmt.Errorf("truncated gRPC response frame")
	}
	return payload[5 : 5+n], nil
}

// fields decodes one level of protobuf wire format: field number -> LEN values
// (varints are returned as their value in a 1-element slice under -number).
func fields(msg []byte) (map[int][][]byte, error) {
	out := map[int][][]byte{}
	for len(msg) > 0 {
		key, n := uvarint(msg)
		if n <= 0 {
			return nil, fmt.Errorf("bad field key")
		}
		msg = msg[n:]
		number, wire := int(key>>3), key&7
		switch wire {
		case 0:
			v, n := uvarint(msg)
			if n <= 0 {
				return nil, fmt.Errorf("bad varint")
			}
			out[-number] = append(out[-number], []byte{byte(v)})
			msg = msg[n:]
		case 2:
			length, n := uvarint(msg)
			if n <= 0 || uint64(len(msg)-n) < length {
				return nil, fmt.Errorf("bad length")
			}
			out[number] = append(out[number], msg[n:n+int(length)])
			msg = msg[n+int(length):]
		case 1:
			msg = msg[8:]
		case 5:
			msg = msg[4:]
		default:
			return nil, fmt.Errorf("wire type %d", wire)
		}
	}
	return out, nil
}

func uvarint(b []byte) (uint64, int) {
	var v uint64
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * uint(i))
		if b[i] < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

// healthCheck calls grpc.health.v1.Health/Check for service "".
func healthCheck(addr, serverName string, roots *x509.CertPool, pair tls.Certificate) (string, error) {
	msg, err := grpcCall(addr, serverName, "/grpc.health.v1.Health/Check", roots, pair, nil)
	if err != nil {
		return "", err
	}
	f, err := fields(msg)
	if err != nil {
		return "", err
	}
	// HealthCheckResponse.status (field 1): SERVING = 1, NOT_SERVING = 2
	if v := f[-1]; len(v) == 1 && v[0][0] == 1 {
		return "SERVING", nil
	} else if len(v) == 1 && v[0][0] == 2 {
		return "NOT_SERVING", nil
	}
	return "", fmt.Errorf("unexpected HealthCheckResponse %x", msg)
}

// listServices asks ServerReflection (package grpc.reflection.VERSION) for the
// service names: ServerReflectionRequest{list_services: ""} is field 7, empty.
func listServices(addr, serverName, version string, roots *x509.CertPool, pair tls.Certificate) ([]string, error) {
	path := "/grpc.reflection." + version + ".ServerReflection/ServerReflectionInfo"
	msg, err := grpcCall(addr, serverName, path, roots, pair, []byte{0x3a, 0x00})
	if err != nil {
		return nil, err
	}
	response, err := fields(msg)
	if err != nil {
		return nil, err
	}
	// ServerReflectionResponse.list_services_response = 6 { repeated service = 1 { name = 1 } }
	if len(response[6]) != 1 {
		return nil, fmt.Errorf("no list_services_response in %x", msg)
	}
	list, err := fields(response[6][0])
	if err != nil {
		return nil, err
	}
	var names []string
	for _, service := range list[1] {
		f, err := fields(service)
		if err != nil || len(f[1]) != 1 {
			return nil, fmt.Errorf("bad ServiceResponse %x", service)
		}
		names = append(names, string(f[1][0]))
	}
	sort.Strings(names)
	return names, nil
}

func main() {
	dir := flag.String("dir", "", "the CA directory `spherecal certs` wrote")
	addr := flag.String("addr", "", "HOST:PORT of a coordinator to handshake with")
	serverName := flag.String("server-name", "localhost", "name to verify on the server certificate")
	reflect := flag.Bool("reflect", false, "with -addr: list services over reflection v1 and v1alpha")
	flag.Parse()
	if *dir == "" {
		fail("-dir is required")
	}
	caCert, err := x509.ParseCertificate(readPEM(filepath.Join(*dir, "ca.pem"), "CERTIFICATE"))
	if err != nil {
		fail("ca.pem: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	pems, _ := filepath.Glob(filepath.Join(*dir, "*.pem"))
	sort.Strings(pems)
	clients := map[string]tls.Certificate{}
	for _, path := range pems {
		name := strings.TrimSuffix(filepath.Base(path), ".pem")
		if name == "ca" || name == "crl" {
			continue
		}
		pair, err := tls.LoadX509KeyPair(path, filepath.Join(*dir, name+".key"))
		if err != nil {
			fail("%s: %v", name, err)
		}
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			fail("%s: %v", name, err)
		}
		usage := x509.ExtKeyUsageClientAuth
		if name == "server" {
			usage = x509.ExtKeyUsageServerAuth
		}
		_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}})
		if err != nil {
			fail("%s: does not verify against ca.pem: %v", name, err)
		}
		bound, err := binding(*dir, name, cert)
		if err != nil {
			fail("%s: %v", name, err)
		}
		report(map[string]interface{}{"pair": name, "parsed": true, "verified": true, "identity_key_bound": bound})
		if name != "server" {
			clients[name] = pair
		}
	}
	if _, err := os.Stat(filepath.Join(*dir, "crl.pem")); err == nil {
		crl, err := x509.ParseRevocationList(readPEM(filepath.Join(*dir, "crl.pem"), "X509 CRL"))
		if err != nil {
			fail("crl.pem: %v", err)
		}
		if err := crl.CheckSignatureFrom(caCert); err != nil {
			fail("crl.pem: %v", err)
		}
		// RFC 5280 §5.2: a conforming CRL carries its number and the issuer's key id
		var number interface{}
		if crl.Number != nil {
			number = crl.Number.String()
		}
		report(map[string]interface{}{
			"crl":              "crl.pem",
			"revoked":          len(crl.RevokedCertificates),
			"number":           number,
			"authority_key_id": namesKey(crl.AuthorityKeyId, caCert.SubjectKeyId),
		})
	}
	if *addr == "" {
		return
	}
	names := make([]string, 0, len(clients))
	for name := range clients {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		status, err := healthCheck(*addr, *serverName, roots, clients[name])
		if err != nil {
			fail("%s: mutual TLS with %s: %v", name, *addr, err)
		}
		report(map[string]interface{}{"handshake": name, "health": status})
	}
	if *reflect && len(names) > 0 {
		for _, version := range []string{"v1", "v1alpha"} {
			services, err := listServices(*addr, *serverName, version, roots, clients[names[0]])
			if err != nil {
				fail("reflection %s: %v", version, err)
			}
			report(map[string]interface{}{"reflection": version, "services": services})
		}
	}
}
