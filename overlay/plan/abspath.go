package plan

import (
	"errors"
	"path"
)

// CheckAbsolutePath refuses a path that is not absolute, not clean, or /:
// the shared part of the checks of every path the overlay is written at or
// mounted at (the overlay root, the container root, a links target), since
// each is compared and joined as text and must mean what it says. The
// error is the reason alone; the caller names the path and what it is.
func CheckAbsolutePath(p string) error {
	switch {
	case !path.IsAbs(p):
		return errors.New("must be an absolute path")
	case path.Clean(p) != p:
		return errors.New("must be clean (no trailing slash, . or ..)")
	case p == "/":
		return errors.New("must not be /")
	}
	return nil
}
