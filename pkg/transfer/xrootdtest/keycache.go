package xrootdtest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// The SciTokens library inside xrootd (scitokens-cpp) finds an issuer's
// keys in a key cache before it asks the issuer: a SQLite database at
// $XDG_CACHE_HOME/scitokens/scitokens_cpp.sqllite, with a table
//
//	keycache (issuer text, keys text)
//
// whose keys are {"jwks": <the issuer's key set>, "expires": <unix time>,
// "next_update": <unix time>}. It asks the issuer only when the entry is
// missing or past next_update, and then only over HTTPS, with libcurl's
// own CA bundle, which no setting of the library or of xrootd changes
// (in the scitokens-cpp of Debian 12, 0.7.3). So the helper writes the
// issuer's key set, fetched from the issuer itself, into that cache, due
// for no update while the test runs: the library verifies every token's
// signature with the issuer's real keys, and never needs to reach it.
//
// The database is written here rather than with a SQLite library: it is
// two pages, the schema and one row, in SQLite's stable, documented file
// format (version 3, a 4096-byte page, a table b-tree leaf on each).

// keyCacheFile is the name of the cache under $XDG_CACHE_HOME.
const keyCacheFile = "scitokens/scitokens_cpp.sqllite"

// sqlitePage is the page size of the database written.
const sqlitePage = 4096

// keyCacheEntry is the keys column of the issuer's row.
func keyCacheEntry(jwks json.RawMessage, nextUpdate, expires int64) ([]byte, error) {
	return json.Marshal(struct {
		JWKS       json.RawMessage `json:"jwks"`
		NextUpdate int64           `json:"next_update"`
		Expires    int64           `json:"expires"`
	}{jwks, nextUpdate, expires})
}

// keyCacheDB returns a SQLite database holding the table keycache with one
// row, issuer's. The table is declared without the UNIQUE PRIMARY KEY of
// the library's own, which would need an index beside it: the library
// creates the table only if it is missing, and reads and replaces rows by
// issuer either way.
func keyCacheDB(issuer string, keys []byte) ([]byte, error) {
	schema := sqliteRecord("table", "keycache", "keycache", int64(2),
		"CREATE TABLE keycache (issuer text NOT NULL, keys text NOT NULL)")
	row := sqliteRecord(issuer, string(keys))
	db := make([]byte, 2*sqlitePage)
	if err := sqliteLeaf(db[:sqlitePage], 100, schema); err != nil {
		return nil, err
	}
	if err := sqliteLeaf(db[sqlitePage:], 0, row); err != nil {
		return nil, fmt.Errorf("the key set of %s: %w", issuer, err)
	}
	h := db[:100]
	copy(h, "SQLite format 3\x00")
	binary.BigEndian.PutUint16(h[16:], sqlitePage)
	h[18], h[19] = 1, 1                         // legacy (rollback journal) read and write
	h[21], h[22], h[23] = 64, 32, 32            // payload fractions, fixed by the format
	binary.BigEndian.PutUint32(h[24:], 1)       // file change counter
	binary.BigEndian.PutUint32(h[28:], 2)       // pages
	binary.BigEndian.PutUint32(h[40:], 1)       // schema cookie
	binary.BigEndian.PutUint32(h[44:], 4)       // schema format
	binary.BigEndian.PutUint32(h[56:], 1)       // UTF-8
	binary.BigEndian.PutUint32(h[92:], 1)       // the page count is valid for change 1
	binary.BigEndian.PutUint32(h[96:], 3040001) // written as by SQLite 3.40.1
	return db, nil
}

// sqliteLeaf writes page as a table b-tree leaf holding one cell, rowid 1,
// whose payload is record; the page's header starts at off (100 on the
// first page, after the database header).
func sqliteLeaf(page []byte, off int, record []byte) error {
	var cell bytes.Buffer
	cell.Write(sqliteVarint(int64(len(record))))
	cell.Write(sqliteVarint(1))
	cell.Write(record)
	// A payload larger than this would spill into overflow pages.
	if len(record) > sqlitePage-35 || off+8+2+cell.Len() > sqlitePage {
		return fmt.Errorf("a row of %d bytes does not fit in one page of the key cache", len(record))
	}
	start := sqlitePage - cell.Len()
	copy(page[start:], cell.Bytes())
	page[off] = 0x0d // table b-tree leaf
	binary.BigEndian.PutUint16(page[off+3:], 1)
	binary.BigEndian.PutUint16(page[off+5:], uint16(start))
	binary.BigEndian.PutUint16(page[off+8:], uint16(start))
	return nil
}

// sqliteRecord encodes values (string or int64 below 128) in SQLite's
// record format.
func sqliteRecord(values ...any) []byte {
	var types, body bytes.Buffer
	for _, v := range values {
		switch v := v.(type) {
		case string:
			types.Write(sqliteVarint(int64(2*len(v) + 13)))
			body.WriteString(v)
		case int64:
			types.Write(sqliteVarint(1)) // an 8-bit integer
			body.WriteByte(byte(v))
		}
	}
	// The header's size counts itself; sizes here stay below 16384, so
	// its varint is one or two bytes.
	n := types.Len() + 1
	if n >= 128 {
		n++
	}
	rec := sqliteVarint(int64(n))
	rec = append(rec, types.Bytes()...)
	return append(rec, body.Bytes()...)
}

// sqliteVarint encodes v (non-negative, below 2^56) as SQLite's big-endian
// variable-length integer: seven bits a byte, the high bit set on all but
// the last.
func sqliteVarint(v int64) []byte {
	var groups []byte
	for {
		groups = append([]byte{byte(v & 0x7f)}, groups...)
		v >>= 7
		if v == 0 {
			break
		}
	}
	for i := range groups[:len(groups)-1] {
		groups[i] |= 0x80
	}
	return groups
}
