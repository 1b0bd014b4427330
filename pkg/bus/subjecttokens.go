package bus

// The entries of BucketSubjectTokens are sealed with their reference (a
// DTR's token_ref, 130 random bits), which only the DTR's record and
// grants carry: the key of an entry is a one-way digest of the reference,
// and its value the token encrypted with a key derived from it. NATS
// permissions cannot stop a reader allowed to get entries by key from
// asking for "any key" (a wildcard in the subject of a direct get answers
// with some entry and its key): such a reader gets a key and a sealed
// token, and neither the reference nor the token.

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// SubjectTokenKey is the key in BucketSubjectTokens of the entry whose
// reference is ref.
func SubjectTokenKey(ref string) string {
	sum := sha256.Sum256([]byte("sluice subject token key\x00" + ref))
	return "k" + hex.EncodeToString(sum[:20])
}

// subjectTokenAEAD is the cipher of the entry whose reference is ref.
func subjectTokenAEAD(ref string) (cipher.AEAD, error) {
	key, err := hkdf.Key(sha256.New, []byte(ref), nil, "sluice subject token seal", 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// SealSubjectToken is the value of the entry of token under ref.
func SealSubjectToken(ref string, token []byte) ([]byte, error) {
	aead, err := subjectTokenAEAD(ref)
	if err != nil {
		return nil, fmt.Errorf("seal the submitter's token: %w", err)
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal the submitter's token: %w", err)
	}
	return aead.Seal(nonce, nonce, token, []byte(SubjectTokenKey(ref))), nil
}

// errSealed: an entry that does not open with its reference.
var errSealed = errors.New("the entry does not open with its reference")

// OpenSubjectToken is the token of the entry sealed under ref.
func OpenSubjectToken(ref string, sealed []byte) ([]byte, error) {
	aead, err := subjectTokenAEAD(ref)
	if err != nil {
		return nil, fmt.Errorf("open the submitter's token: %w", err)
	}
	if len(sealed) < aead.NonceSize() {
		return nil, fmt.Errorf("open the submitter's token: %w", errSealed)
	}
	tok, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], []byte(SubjectTokenKey(ref)))
	if err != nil {
		return nil, fmt.Errorf("open the submitter's token: %w", errSealed)
	}
	return tok, nil
}
