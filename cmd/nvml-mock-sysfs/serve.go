package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/serve"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/builtin"
)

// serveHelp says what serve does with the profile and its warnings.
const serveHelp = `serve renders --profile (default the built-in ` + builtin.Default + `) at every sync;
unlike render, it never re-uses the root's own effective profile: the root
follows the flags. Warnings about the profile go to the log, at warn level
when the render changed the tree; --strict makes them a failed render,
which leaves the last good tree served and /readyz failing.

`

func runServe(e *env, args []string) int {
	flags := newFlags(e, "serve", "[--profile NAME|FILE] [--root DIR] (--output FILE [--kind KIND] | --merge-into FILE)... [--container-root DIR] [--also-at PATH]... [--hierarchy flat|hgx|dgx] [--host-devices none|merge] [--host-sysfs /sys] [--lock-timeout DURATION] [--no-binary] [--compare-content] [--strict] [--force] [--listen ADDR] [--resync DURATION] [--stop-timeout DURATION] [--no-watch] [--log-format text|json] [--log-level debug|info|warn|error]", serveHelp+renderHelp)
	var ra renderArgs
	flags.StringVar(&ra.o.Profile, "profile", builtin.Default, "a built-in profile name or a profile file, rendered at every sync")
	ra.register(flags)
	var sa specArgs
	sa.register(flags)
	var o serve.Options
	registerAlsoAt(flags, &o.AlsoAt)
	flags.StringVar(&o.Listen, "listen", serve.DefaultListen, "address of "+serve.HealthzPath+" and "+serve.ReadyzPath)
	flags.DurationVar(&o.Resync, "resync", serve.DefaultResync, "sync this often even without a change event, as a safety net")
	flags.DurationVar(&o.StopTimeout, "stop-timeout", serve.DefaultStopTimeout, "on SIGTERM, wait this long for the render in flight")
	flags.BoolVar(&o.NoWatch, "no-watch", false, "do not watch the profile's and the specs' directories; only resync")
	var logFormat string
	var logLevel slog.Level
	flags.StringVar(&logFormat, "log-format", "text", "text or json")
	flags.TextVar(&logLevel, "log-level", slog.LevelInfo, "debug (also logs unchanged resyncs), info, warn or error")
	if code, ok := parse(e, flags, args); !ok {
		return code
	}
	if sa.output == "" && sa.mergeInto == "" {
		return usageError(e, "serve", "give --output FILE, --merge-into FILE, or both")
	}
	if code, ok := sa.check(e, "serve"); !ok {
		return code
	}
	ho := &slog.HandlerOptions{Level: logLevel}
	switch logFormat {
	case "text":
		o.Logger = slog.New(slog.NewTextHandler(e.stderr, ho))
	case "json":
		o.Logger = slog.New(slog.NewJSONHandler(e.stderr, ho))
	default:
		return usageError(e, "serve", "--log-format %q: want text or json", logFormat)
	}
	var code int
	var ok bool
	if o.Render, code, ok = ra.options(e, "serve"); !ok {
		return code
	}
	// A name that is neither a built-in nor a file is a typo that no
	// resync mends: a usage error, as for render. Any other bad profile
	// is the loop's to report, and to recover from.
	if _, _, err := builtin.Load(o.Render.Profile); err != nil {
		var unknown *builtin.UnknownError
		if errors.As(err, &unknown) {
			return usageError(e, "serve", "%v", err)
		}
	}
	if code, ok := ra.withBinary(e, "serve", &o.Render); !ok {
		return code
	}
	o.Output, o.Kind, o.MergeInto = sa.output, sa.kind, sa.mergeInto
	s, err := serve.New(o)
	if err != nil {
		return usageError(e, "serve", "%s", alsoAtError(err))
	}
	// Run would open the listener first thing too; opening it here lets
	// the message name the flag.
	if _, err := s.Listen(); err != nil {
		return fail(e, "serve: --listen %s: %v", o.Listen, err)
	}
	// SIGTERM is how the kubelet stops the pod; SIGINT is a terminal's ^C.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := s.Run(ctx); err != nil {
		return fail(e, "serve: %v", err)
	}
	return exitOK
}
