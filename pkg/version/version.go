// Package version holds the build version, set by -ldflags from git describe.
package version

// Version is set at build time with -X; "dev" when unknown.
var Version = "dev"
