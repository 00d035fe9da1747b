// Package deploy delivers the rendered tree to containers.
package deploy
