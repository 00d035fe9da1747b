/*
 * nvml.c: nvml-mock-sysfs's NVML stand-in, a libnvidia-ml.so.1 of our own.
 *
 * Why it exists: the end-to-end suites run real NVML consumers (GPU Feature
 * Discovery v0.17.4, our nvml-list) against a rendered PCI tree, and those
 * need an NVML at run time. nvml-mock's NVML is served by no registry these
 * machines reach, so without it those rows could not run at all. This file
 * answers only what those consumers ask, from a flat text file; it knows
 * nothing of PCI sysfs, which the consumers read for themselves.
 *
 * Build (no dependency beyond libc):
 *   cc -shared -fPIC -O2 -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 nvml.c
 *
 * Input, read at every nvmlInit that finds the library uninitialised (as
 * nvml-mock's NVML re-reads its profile), from the first of:
 *   NVML_MOCK_SYSFS_STAND_IN  names a flat file in the format below;
 *   MOCK_NVML_CONFIG          nvml-mock's own variable, naming an nvml-mock
 *                             profile: the stand-in runs the converter
 *                             nvml-stand-in-config, which must sit beside
 *                             this library, as "nvml-stand-in-config PROFILE"
 *                             and reads the format below from its output.
 * Both are written by WriteStandInConfig (deploy/e2e/programs/standin.go),
 * which keeps the profile parsing in Go, the product's. With neither set,
 * or the file unreadable or the converter missing, nvmlInit fails with
 * NVML_ERROR_LIBRARY_NOT_FOUND and one line on standard error naming the
 * variable and the path; a malformed input (or a converter that fails, and
 * says why itself) fails it with NVML_ERROR_UNKNOWN and one line naming
 * the file, line, field and value.
 *
 * Format: one record per line, fields separated by single spaces; blank
 * lines and lines starting with '#' are ignored.
 *
 *   driver <version>        driver version string, e.g. 550.163.01 (once)
 *   cuda <number>           CUDA driver version as NVML encodes it,
 *                           1000*major + 10*minor: 12040 is 12.4 (once)
 *   gpu <busId> <pciDeviceId> <pciSubSystemId> <memory> <ccMajor> <ccMinor>
 *       <mig> <minor> <uuid> <name>
 *                           one line per GPU, in NVML index order:
 *     busId           NVML's form, 00000000:1A:00.0 (hex, any case; a
 *                     4-digit domain is read too); reported upper case
 *     pciDeviceId     hex word (device << 16) | vendor, e.g. 0x233010DE
 *     pciSubSystemId  hex word, packed the same way (0 if unknown)
 *     memory          total framebuffer bytes, decimal (0: unknown, and
 *                     nvmlDeviceGetMemoryInfo says NOT_SUPPORTED)
 *     ccMajor ccMinor CUDA compute capability, decimal (0 0: unknown)
 *     mig             0: not MIG capable (nvmlDeviceGetMigMode says
 *                     NOT_SUPPORTED); n > 0: MIG capable, MIG disabled, at
 *                     most n MIG devices
 *     minor           the /dev/nvidiaN minor number, decimal
 *     uuid            GPU-xxxxxxxx-... (no spaces)
 *     name            the product name, the rest of the line (may hold
 *                     spaces): NVIDIA H100 80GB HBM3
 *
 * The entry points below are those GFD v0.17.4 (go-nvml v0.12.9-0,
 * go-nvlib v0.7.4) and nvml-list (go-nvml v0.13.3-1) call, plus a few
 * lookups by identity that cost nothing. go-nvml binds symbols lazily, so
 * a called symbol missing here would kill the consumer; symbols it only
 * probes with dlsym (nvmlDeviceGetGpuFabricInfo) are left out on purpose so
 * that the probe answers "absent" as it does on a GPU without a fabric.
 *
 * The types are declared here, not taken from NVIDIA's header: only the
 * layouts these calls use, as go-nvml's generated types show them.
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define EXPORT __attribute__((visibility("default")))

/* nvmlReturn_t values (go-nvml's const.go). */
typedef int nvmlReturn_t;
enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_LIBRARY_NOT_FOUND = 12,
	NVML_ERROR_FUNCTION_NOT_FOUND = 13,
	NVML_ERROR_UNKNOWN = 999,
};

/* nvmlPciInfo_t: the layout nvmlDeviceGetPciInfo_v2/_v3 fill. */
typedef struct {
	char busIdLegacy[16];
	unsigned int domain;
	unsigned int bus;
	unsigned int device;
	unsigned int pciDeviceId;
	unsigned int pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;

/* nvmlMemory_t: nvmlDeviceGetMemoryInfo's (version 1) answer, in bytes. */
typedef struct {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_t;

/* Buffer sizes the consumers pass (NVML_DEVICE_NAME_V2_BUFFER_SIZE etc.):
 * a stored string must fit the smallest buffer a caller is promised. */
#define NAME_SIZE 96
#define UUID_SIZE 96
#define VERSION_SIZE 80
/* A profile holds at most 16384 devices (profile.MaxDevices). */
#define MAX_GPUS 16384

/* One GPU. A handle (nvmlDevice_t) is a pointer to one of these. */
struct nvmlDevice_st {
	unsigned int domain, bus, dev, function;
	unsigned int pciDeviceId, pciSubSystemId;
	unsigned long long memory;
	int ccMajor, ccMinor;
	unsigned int migMax;
	unsigned int minor;
	char uuid[UUID_SIZE];
	char name[NAME_SIZE];
};
typedef struct nvmlDevice_st *nvmlDevice_t;

/* The library's state. NVML counts nvmlInit calls and forgets its devices
 * at the last nvmlShutdown; go-nvml may also dlclose and reopen the
 * library in between, so the input is read again at every nvmlInit that
 * finds the count at zero. */
static struct {
	pthread_mutex_t lock;
	int refs;
	char driver[VERSION_SIZE];
	int cuda;
	unsigned int count, cap;
	/* Grown while loading, never moved after: handles point into it. It
	 * is kept across a shutdown, so a stale handle still points at memory
	 * of ours (and is refused: count is 0). */
	struct nvmlDevice_st *gpus;
} st = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The two inputs: a flat file of ours, or nvml-mock's own variable naming
 * a profile, which the converter beside this library turns into one. */
static const char configEnv[] = "NVML_MOCK_SYSFS_STAND_IN";
static const char profileEnv[] = "MOCK_NVML_CONFIG";
static const char converter[] = "nvml-stand-in-config";

nvmlReturn_t nvmlInit_v2(void);

/* refuse prints the one line that says why a file cannot be served. */
static nvmlReturn_t refuse(const char *path, int line, const char *field, const char *value, const char *why)
{
	if (line > 0)
		fprintf(stderr, "nvml stand-in: %s line %d: %s \"%s\": %s\n", path, line, field, value, why);
	else
		fprintf(stderr, "nvml stand-in: %s: %s: %s\n", path, field, why);
	return NVML_ERROR_UNKNOWN;
}

/* number parses a whole decimal or (with base 16) hex token. */
static int number(const char *s, int base, unsigned long long max, unsigned long long *out)
{
	char *end;
	if (*s == '\0' || *s == '-' || *s == '+')
		return 0;
	errno = 0;
	unsigned long long v = strtoull(s, &end, base);
	if (errno != 0 || *end != '\0' || v > max)
		return 0;
	*out = v;
	return 1;
}

/* parseGPU reads the fields after "gpu" into g; rest points past "gpu ". */
static nvmlReturn_t parseGPU(const char *path, int line, char *rest, struct nvmlDevice_st *g)
{
	static const char *const fields[] = {"busId", "pciDeviceId", "pciSubSystemId", "memory", "ccMajor", "ccMinor", "mig", "minor", "uuid", "name"};
	char *tok[9];
	char *p = rest;
	for (int i = 0; i < 9; i++) {
		char *sp = strchr(p, ' ');
		if (sp == NULL) {
			/* The last field present is whole; the next one is missing. */
			const char *missing = fields[*p != '\0' ? i + 1 : i];
			return refuse(path, line, missing, "", "missing: a gpu line has busId pciDeviceId pciSubSystemId memory ccMajor ccMinor mig minor uuid name");
		}
		*sp = '\0';
		tok[i] = p;
		p = sp + 1;
	}
	char *name = p;
	unsigned long long v;
	char extra;
	if (sscanf(tok[0], "%8x:%2x:%2x.%1x%c", &g->domain, &g->bus, &g->dev, &g->function, &extra) != 4 || g->dev > 0x1f || g->function > 7)
		return refuse(path, line, fields[0], tok[0], "want a bus id such as 00000000:1A:00.0");
	if (!number(tok[1], 16, 0xffffffffULL, &v))
		return refuse(path, line, fields[1], tok[1], "want a hex word such as 0x233010DE");
	g->pciDeviceId = (unsigned int)v;
	if (!number(tok[2], 16, 0xffffffffULL, &v))
		return refuse(path, line, fields[2], tok[2], "want a hex word such as 0x16C110DE");
	g->pciSubSystemId = (unsigned int)v;
	if (!number(tok[3], 10, ~0ULL, &g->memory))
		return refuse(path, line, fields[3], tok[3], "want a decimal byte count");
	if (!number(tok[4], 10, 1000, &v))
		return refuse(path, line, fields[4], tok[4], "want a decimal number");
	g->ccMajor = (int)v;
	if (!number(tok[5], 10, 1000, &v))
		return refuse(path, line, fields[5], tok[5], "want a decimal number");
	g->ccMinor = (int)v;
	if (!number(tok[6], 10, 1000, &v))
		return refuse(path, line, fields[6], tok[6], "want 0 (not MIG capable) or the most MIG devices");
	g->migMax = (unsigned int)v;
	if (!number(tok[7], 10, 0xffffffffULL, &v))
		return refuse(path, line, fields[7], tok[7], "want a decimal number");
	g->minor = (unsigned int)v;
	if (tok[8][0] == '\0' || strlen(tok[8]) >= UUID_SIZE)
		return refuse(path, line, fields[8], tok[8], "want a uuid of 1 to 95 characters");
	strcpy(g->uuid, tok[8]);
	if (name[0] == '\0' || strlen(name) >= NAME_SIZE)
		return refuse(path, line, "name", name, "want a name of 1 to 95 characters");
	strcpy(g->name, name);
	return NVML_SUCCESS;
}

/* parse reads the lines of f into st; what names f in refusals. */
static nvmlReturn_t parse(FILE *f, const char *what)
{
	nvmlReturn_t ret = NVML_SUCCESS;
	char *buf = NULL;
	size_t cap = 0;
	ssize_t n;
	int line = 0, haveDriver = 0, haveCuda = 0;
	st.count = 0;
	while (ret == NVML_SUCCESS && (n = getline(&buf, &cap, f)) >= 0) {
		line++;
		while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
			buf[--n] = '\0';
		if (n == 0 || buf[0] == '#')
			continue;
		char *rest = strchr(buf, ' ');
		if (rest == NULL) {
			ret = refuse(what, line, "record", buf, "want a key and a value");
			break;
		}
		*rest++ = '\0';
		unsigned long long v;
		if (strcmp(buf, "driver") == 0) {
			if (haveDriver)
				ret = refuse(what, line, "driver", rest, "given twice");
			else if (rest[0] == '\0' || strchr(rest, ' ') != NULL || strlen(rest) >= VERSION_SIZE)
				ret = refuse(what, line, "driver", rest, "want one version such as 550.163.01");
			else
				strcpy(st.driver, rest), haveDriver = 1;
		} else if (strcmp(buf, "cuda") == 0) {
			if (haveCuda)
				ret = refuse(what, line, "cuda", rest, "given twice");
			else if (!number(rest, 10, 1000000, &v))
				ret = refuse(what, line, "cuda", rest, "want 1000*major + 10*minor, such as 12040");
			else
				st.cuda = (int)v, haveCuda = 1;
		} else if (strcmp(buf, "gpu") == 0) {
			if (st.count == MAX_GPUS) {
				ret = refuse(what, line, "gpu", rest, "more GPUs than a profile holds (16384)");
			} else if (st.count == st.cap) {
				unsigned int cap = st.cap ? 2 * st.cap : 16;
				struct nvmlDevice_st *g = realloc(st.gpus, cap * sizeof *g);
				if (g == NULL)
					ret = refuse(what, line, "gpu", rest, "out of memory");
				else
					st.gpus = g, st.cap = cap;
			}
			if (ret == NVML_SUCCESS && (ret = parseGPU(what, line, rest, &st.gpus[st.count])) == NVML_SUCCESS)
				st.count++;
		} else {
			ret = refuse(what, line, "key", buf, "want driver, cuda or gpu");
		}
	}
	free(buf);
	if (ret == NVML_SUCCESS && ferror(f))
		ret = refuse(what, 0, "read", "", strerror(errno));
	if (ret == NVML_SUCCESS && !haveDriver)
		ret = refuse(what, 0, "driver", "", "missing: the file needs a line such as driver 550.163.01");
	if (ret == NVML_SUCCESS && !haveCuda)
		ret = refuse(what, 0, "cuda", "", "missing: the file needs a line such as cuda 12040");
	if (ret != NVML_SUCCESS)
		st.count = 0;
	return ret;
}

/* convert runs the converter beside this library on the nvml-mock profile
 * and parses what it prints. Its errors reach standard error as they are:
 * it names the profile, the field and the value itself. */
static nvmlReturn_t convert(const char *profile)
{
	Dl_info self;
	char conv[4096];
	if (dladdr((void *)nvmlInit_v2, &self) == 0 || self.dli_fname == NULL) {
		fprintf(stderr, "nvml stand-in: %s=%s: cannot find this library's own directory, where %s is\n", profileEnv, profile, converter);
		return NVML_ERROR_LIBRARY_NOT_FOUND;
	}
	const char *slash = strrchr(self.dli_fname, '/');
	int dirLen = slash == NULL ? 1 : (int)(slash - self.dli_fname);
	if (snprintf(conv, sizeof conv, "%.*s/%s", dirLen, slash == NULL ? "." : self.dli_fname, converter) >= (int)sizeof conv) {
		fprintf(stderr, "nvml stand-in: %s: path too long\n", self.dli_fname);
		return NVML_ERROR_LIBRARY_NOT_FOUND;
	}
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) != 0) {
		fprintf(stderr, "nvml stand-in: %s=%s: pipe: %s\n", profileEnv, profile, strerror(errno));
		return NVML_ERROR_UNKNOWN;
	}
	/* posix_spawn, not popen: no shell to quote the paths for, and safe in
	 * a multithreaded (Go) process. */
	posix_spawn_file_actions_t actions;
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
	char *argv[] = {conv, (char *)profile, NULL};
	pid_t pid;
	int err = posix_spawn(&pid, conv, &actions, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&actions);
	close(fds[1]);
	if (err != 0) {
		close(fds[0]);
		fprintf(stderr, "nvml stand-in: %s=%s: cannot run %s: %s\n", profileEnv, profile, conv, strerror(err));
		return NVML_ERROR_LIBRARY_NOT_FOUND;
	}
	/* All of the output first, then the exit status: a converter that
	 * fails has said why, and its partial output is not parsed. */
	char *out = NULL;
	size_t len = 0, cap = 0;
	int readErr = 0;
	for (;;) {
		if (len + 4096 > cap) {
			char *grown = realloc(out, cap = 2 * cap + 4096);
			if (grown == NULL) {
				readErr = ENOMEM;
				break;
			}
			out = grown;
		}
		ssize_t n = read(fds[0], out + len, cap - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			readErr = errno;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fds[0]); /* before the wait: a converter still writing ends */
	int status;
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR) {
			status = -1;
			break;
		}
	}
	nvmlReturn_t ret;
	char what[4200];
	snprintf(what, sizeof what, "output of %s %s", conv, profile);
	if (status == -1) {
		fprintf(stderr, "nvml stand-in: %s %s: wait: %s\n", conv, profile, strerror(errno));
		ret = NVML_ERROR_UNKNOWN;
	} else if (WIFSIGNALED(status)) {
		fprintf(stderr, "nvml stand-in: %s %s: killed by signal %d\n", conv, profile, WTERMSIG(status));
		ret = NVML_ERROR_UNKNOWN;
	} else if (WEXITSTATUS(status) != 0) {
		fprintf(stderr, "nvml stand-in: %s %s: exit status %d\n", conv, profile, WEXITSTATUS(status));
		ret = NVML_ERROR_UNKNOWN;
	} else if (readErr != 0) {
		ret = refuse(what, 0, "read", "", strerror(readErr));
	} else if (len == 0) {
		ret = refuse(what, 0, "output", "", "empty");
	} else {
		FILE *f = fmemopen(out, len, "r");
		if (f == NULL) {
			ret = refuse(what, 0, "read", "", strerror(errno));
		} else {
			ret = parse(f, what);
			fclose(f);
		}
	}
	free(out);
	if (ret != NVML_SUCCESS)
		st.count = 0;
	return ret;
}

/* load fills st from the flat file NVML_MOCK_SYSFS_STAND_IN names, else
 * from the nvml-mock profile MOCK_NVML_CONFIG names, through the
 * converter. */
static nvmlReturn_t load(void)
{
	const char *path = getenv(configEnv);
	if (path != NULL && *path != '\0') {
		FILE *f = fopen(path, "r");
		if (f == NULL) {
			fprintf(stderr, "nvml stand-in: %s=%s: %s\n", configEnv, path, strerror(errno));
			return NVML_ERROR_LIBRARY_NOT_FOUND;
		}
		nvmlReturn_t ret = parse(f, path);
		fclose(f);
		return ret;
	}
	const char *profile = getenv(profileEnv);
	if (profile != NULL && *profile != '\0')
		return convert(profile);
	fprintf(stderr, "nvml stand-in: neither %s (a file of GPUs) nor %s (an nvml-mock profile) is set\n", configEnv, profileEnv);
	return NVML_ERROR_LIBRARY_NOT_FOUND;
}

/* ready says whether the library is initialised, as every query needs. */
static int ready(void)
{
	pthread_mutex_lock(&st.lock);
	int r = st.refs > 0;
	pthread_mutex_unlock(&st.lock);
	return r;
}

/* gpu checks a handle: one of ours, while initialised. */
static nvmlReturn_t gpu(nvmlDevice_t d)
{
	if (!ready())
		return NVML_ERROR_UNINITIALIZED;
	if (d == NULL || d < st.gpus || d >= st.gpus + st.count)
		return NVML_ERROR_INVALID_ARGUMENT;
	return NVML_SUCCESS;
}

/* gpuOut is gpu for a call that answers through the pointer out, which
 * must not be NULL. */
static nvmlReturn_t gpuOut(nvmlDevice_t d, const void *out)
{
	nvmlReturn_t ret = gpu(d);
	if (ret == NVML_SUCCESS && out == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	return ret;
}

/* copyOut writes s into a caller's buffer of size n. */
static nvmlReturn_t copyOut(const char *s, char *buf, unsigned int n)
{
	if (buf == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (strlen(s) + 1 > n)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	strcpy(buf, s);
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
	pthread_mutex_lock(&st.lock);
	nvmlReturn_t ret = NVML_SUCCESS;
	if (st.refs == 0)
		ret = load();
	if (ret == NVML_SUCCESS)
		st.refs++;
	pthread_mutex_unlock(&st.lock);
	return ret;
}

/* The unversioned and flagged forms: go-nvml falls back to nvmlInit when
 * nvmlInit_v2 is absent, and nvmlInitWithFlags takes flags this stand-in
 * has no use for. */
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	(void)flags;
	return nvmlInit_v2();
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
	pthread_mutex_lock(&st.lock);
	nvmlReturn_t ret = NVML_SUCCESS;
	if (st.refs == 0)
		ret = NVML_ERROR_UNINITIALIZED;
	else if (--st.refs == 0)
		st.count = 0;
	pthread_mutex_unlock(&st.lock);
	return ret;
}

/* nvmlErrorString: go-nvml formats every non-success return through it
 * once the library is loaded. */
EXPORT const char *nvmlErrorString(nvmlReturn_t r)
{
	switch (r) {
	case NVML_SUCCESS:
		return "Success";
	case NVML_ERROR_UNINITIALIZED:
		return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT:
		return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED:
		return "Not Supported";
	case NVML_ERROR_NOT_FOUND:
		return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE:
		return "Insufficient Size";
	case NVML_ERROR_LIBRARY_NOT_FOUND:
		return "NVML Shared Library Not Found";
	case NVML_ERROR_FUNCTION_NOT_FOUND:
		return "Function Not Found";
	case NVML_ERROR_UNKNOWN:
		return "Unknown Error";
	default:
		return "Unknown Error";
	}
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	if (!ready())
		return NVML_ERROR_UNINITIALIZED;
	return copyOut(st.driver, version, length);
}

/* nvmlSystemGetNVMLVersion: NVML's own version is the CUDA major before
 * the driver version, 12.550.163.01. */
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
	if (!ready())
		return NVML_ERROR_UNINITIALIZED;
	char v[VERSION_SIZE + 16];
	snprintf(v, sizeof v, "%d.%s", st.cuda / 1000, st.driver);
	return copyOut(v, version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
	if (!ready())
		return NVML_ERROR_UNINITIALIZED;
	if (version == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*version = st.cuda;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (!ready())
		return NVML_ERROR_UNINITIALIZED;
	if (count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = st.count;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	if (!ready())
		return NVML_ERROR_UNINITIALIZED;
	if (device == NULL || index >= st.count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &st.gpus[index];
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
	return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
	if (!ready())
		return NVML_ERROR_UNINITIALIZED;
	if (uuid == NULL || device == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (unsigned int i = 0; i < st.count; i++) {
		if (strcmp(st.gpus[i].uuid, uuid) == 0) {
			*device = &st.gpus[i];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

/* nvmlDeviceGetHandleByPciBusId_v2 takes either domain width
 * (0000:1a:00.0 or 00000000:1A:00.0), in any case, as NVML does. */
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *busId, nvmlDevice_t *device)
{
	if (!ready())
		return NVML_ERROR_UNINITIALIZED;
	unsigned int domain, bus, dev, function;
	char extra;
	if (busId == NULL || device == NULL || sscanf(busId, "%8x:%2x:%2x.%1x%c", &domain, &bus, &dev, &function, &extra) != 4)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (unsigned int i = 0; i < st.count; i++) {
		struct nvmlDevice_st *g = &st.gpus[i];
		if (g->domain == domain && g->bus == bus && g->dev == dev && g->function == function) {
			*device = g;
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
	nvmlReturn_t ret = gpuOut(device, index);
	if (ret != NVML_SUCCESS)
		return ret;
	*index = (unsigned int)(device - st.gpus);
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	nvmlReturn_t ret = gpuOut(device, pci);
	if (ret != NVML_SUCCESS)
		return ret;
	memset(pci, 0, sizeof *pci);
	/* The legacy field has room for a 4-digit domain only. */
	snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", device->domain & 0xffff, device->bus, device->dev, device->function);
	snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", device->domain, device->bus, device->dev, device->function);
	pci->domain = device->domain;
	pci->bus = device->bus;
	pci->device = device->dev;
	pci->pciDeviceId = device->pciDeviceId;
	pci->pciSubSystemId = device->pciSubSystemId;
	return NVML_SUCCESS;
}

/* _v2 fills the same structure; go-nvml takes _v3 when it is present. */
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(device, pci); }

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
	nvmlReturn_t ret = gpu(device);
	return ret != NVML_SUCCESS ? ret : copyOut(device->name, name, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	nvmlReturn_t ret = gpu(device);
	return ret != NVML_SUCCESS ? ret : copyOut(device->uuid, uuid, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
	nvmlReturn_t ret = gpuOut(device, minor);
	if (ret != NVML_SUCCESS)
		return ret;
	*minor = device->minor;
	return NVML_SUCCESS;
}

/* nvmlDeviceGetMemoryInfo: an idle GPU, all of it free. A file that gives
 * no size says NOT_SUPPORTED, which GFD logs and labels no memory for. */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	nvmlReturn_t ret = gpuOut(device, memory);
	if (ret != NVML_SUCCESS)
		return ret;
	if (device->memory == 0)
		return NVML_ERROR_NOT_SUPPORTED;
	memory->total = device->memory;
	memory->free = device->memory;
	memory->used = 0;
	return NVML_SUCCESS;
}

/* nvmlDeviceGetCudaComputeCapability: 0.0 when the file gives none, which
 * GFD takes as "no architecture labels". */
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
	nvmlReturn_t ret = gpu(device);
	if (ret != NVML_SUCCESS)
		return ret;
	if (major == NULL || minor == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	*major = device->ccMajor;
	*minor = device->ccMinor;
	return NVML_SUCCESS;
}

/* nvmlDeviceGetMigMode: NOT_SUPPORTED is how NVML says a GPU is not MIG
 * capable (go-nvlib's IsMigCapable); a capable GPU here is always disabled
 * (0), now and pending, since the stand-in serves no MIG devices. */
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
	nvmlReturn_t ret = gpu(device);
	if (ret != NVML_SUCCESS)
		return ret;
	if (current == NULL || pending == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (device->migMax == 0)
		return NVML_ERROR_NOT_SUPPORTED;
	*current = 0;
	*pending = 0;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
	nvmlReturn_t ret = gpuOut(device, count);
	if (ret != NVML_SUCCESS)
		return ret;
	if (device->migMax == 0)
		return NVML_ERROR_NOT_SUPPORTED;
	*count = device->migMax;
	return NVML_SUCCESS;
}

/* nvmlDeviceGetMigDeviceHandleByIndex: MIG is disabled, so no slot holds a
 * MIG device; go-nvlib skips NOT_FOUND. */
EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *mig)
{
	nvmlReturn_t ret = gpuOut(device, mig);
	if (ret != NVML_SUCCESS)
		return ret;
	if (device->migMax == 0)
		return NVML_ERROR_NOT_SUPPORTED;
	(void)index;
	return NVML_ERROR_NOT_FOUND;
}

/* nvmlDeviceIsMigDeviceHandle: every handle here is a full GPU. */
EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMig)
{
	nvmlReturn_t ret = gpuOut(device, isMig);
	if (ret != NVML_SUCCESS)
		return ret;
	*isMig = 0;
	return NVML_SUCCESS;
}
