module nvml-mock-sysfs.test/ghw-list

go 1.26.0

require (
	github.com/jaypipes/ghw v0.27.0
	github.com/jaypipes/pcidb v1.1.1
)

require (
	github.com/go-ole/go-ole v1.2.6 // indirect
	github.com/yusufpapurcu/wmi v1.2.4 // indirect
	golang.org/x/sys v0.25.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
	howett.net/plist v1.0.2-0.20250314012144-ee69052608d9 // indirect
)
