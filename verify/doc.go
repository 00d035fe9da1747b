// Package verify checks a live container from inside.
package verify
