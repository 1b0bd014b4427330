package token

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
)

// BenchmarkExchangedStorageToken is what a request costs for its storage
// token: from the cache (a token that outlives the transfer), or by a
// token exchange at the in-process issuer (each a new scope).
func BenchmarkExchangedStorageToken(b *testing.B) {
	iss := tokentest.Start(b)
	c := iss.Client(b)
	src, err := NewStorageSource(StorageConfig{Issuer: iss.URL, ClientID: c.ID, ClientSecretFile: c.SecretFile, Margin: 2 * time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	subject := iss.Mint(b, tokentest.Mint{Subject: "alice", Scopes: []string{"storage.read:/data"}})
	ctx := WithNeededUntil(b.Context(), time.Now().Add(time.Minute))
	b.Run("cached", func(b *testing.B) {
		if _, err := src.Exchange(ctx, subject, storageAud, "storage.read:/data/f"); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := src.Exchange(ctx, subject, storageAud, "storage.read:/data/f"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("exchanged", func(b *testing.B) {
		n := 0
		for b.Loop() {
			n++
			if _, err := src.Exchange(ctx, subject, storageAud, "storage.read:/data/f"+strconv.Itoa(n)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
