package focuscheck

// Allowed values and fixed lists of the FOCUS 1.2 specification
// (specification/columns/*.md, "Allowed values"; attributes/*.md).

var chargeCategories = set("Usage", "Purchase", "Tax", "Credit", "Adjustment")

var chargeFrequencies = set("One-Time", "Recurring", "Usage-Based")

var pricingCategories = set("Standard", "Dynamic", "Committed", "Other")

var serviceCategories = set("AI and Machine Learning", "Analytics", "Business Applications", "Compute", "Databases",
	"Developer Tools", "Multicloud", "Identity", "Integration", "Internet of Things", "Management and Governance",
	"Media", "Migration", "Mobile", "Networking", "Security", "Storage", "Web", "Other")

var commitmentDiscountCategories = set("Spend", "Usage")

var commitmentDiscountStatuses = set("Used", "Unused")

var capacityReservationStatuses = set("Used", "Unused")

// serviceSubcategories are the allowed ServiceSubcategory values, each
// with its one parent ServiceCategory (servicesubcategory.md).
var serviceSubcategories = func() map[string]string {
	m := map[string]string{}
	for _, p := range [][2]string{
		{"AI and Machine Learning", "AI Platforms"},
		{"AI and Machine Learning", "Bots"},
		{"AI and Machine Learning", "Generative AI"},
		{"AI and Machine Learning", "Machine Learning"},
		{"AI and Machine Learning", "Natural Language Processing"},
		{"AI and Machine Learning", "Other (AI and Machine Learning)"},
		{"Analytics", "Analytics Platforms"},
		{"Analytics", "Business Intelligence"},
		{"Analytics", "Data Processing"},
		{"Analytics", "Search"},
		{"Analytics", "Streaming Analytics"},
		{"Analytics", "Other (Analytics)"},
		{"Business Applications", "Productivity and Collaboration"},
		{"Business Applications", "Other (Business Applications)"},
		{"Compute", "Containers"},
		{"Compute", "End User Computing"},
		{"Compute", "Quantum Compute"},
		{"Compute", "Serverless Compute"},
		{"Compute", "Virtual Machines"},
		{"Compute", "Other (Compute)"},
		{"Databases", "Caching"},
		{"Databases", "Data Warehouses"},
		{"Databases", "Ledger Databases"},
		{"Databases", "NoSQL Databases"},
		{"Databases", "Relational Databases"},
		{"Databases", "Time Series Databases"},
		{"Databases", "Other (Databases)"},
		{"Developer Tools", "Developer Platforms"},
		{"Developer Tools", "Continuous Integration and Deployment"},
		{"Developer Tools", "Development Environments"},
		{"Developer Tools", "Source Code Management"},
		{"Developer Tools", "Quality Assurance"},
		{"Developer Tools", "Other (Developer Tools)"},
		{"Identity", "Identity and Access Management"},
		{"Identity", "Other (Identity)"},
		{"Integration", "API Management"},
		{"Integration", "Messaging"},
		{"Integration", "Workflow Orchestration"},
		{"Integration", "Other (Integration)"},
		{"Internet of Things", "IoT Analytics"},
		{"Internet of Things", "IoT Platforms"},
		{"Internet of Things", "Other (Internet of Things)"},
		{"Management and Governance", "Architecture"},
		{"Management and Governance", "Compliance"},
		{"Management and Governance", "Cost Management"},
		{"Management and Governance", "Data Governance"},
		{"Management and Governance", "Disaster Recovery"},
		{"Management and Governance", "Endpoint Management"},
		{"Management and Governance", "Observability"},
		{"Management and Governance", "Support"},
		{"Management and Governance", "Other (Management and Governance)"},
		{"Media", "Content Creation"},
		{"Media", "Gaming"},
		{"Media", "Media Streaming"},
		{"Media", "Mixed Reality"},
		{"Media", "Other (Media)"},
		{"Migration", "Data Migration"},
		{"Migration", "Resource Migration"},
		{"Migration", "Other (Migration)"},
		{"Mobile", "Other (Mobile)"},
		{"Multicloud", "Multicloud Integration"},
		{"Multicloud", "Other (Multicloud)"},
		{"Networking", "Application Networking"},
		{"Networking", "Content Delivery"},
		{"Networking", "Network Connectivity"},
		{"Networking", "Network Infrastructure"},
		{"Networking", "Network Routing"},
		{"Networking", "Network Security"},
		{"Networking", "Other (Networking)"},
		{"Security", "Secret Management"},
		{"Security", "Security Posture Management"},
		{"Security", "Threat Detection and Response"},
		{"Security", "Other (Security)"},
		{"Storage", "Backup Storage"},
		{"Storage", "Block Storage"},
		{"Storage", "File Storage"},
		{"Storage", "Object Storage"},
		{"Storage", "Storage Platforms"},
		{"Storage", "Other (Storage)"},
		{"Web", "Application Platforms"},
		{"Web", "Other (Web)"},
		{"Other", "Other (Other)"},
	} {
		m[p[1]] = p[0]
	}
	return m
}()

// skuPriceProperties are the FOCUS-defined SkuPriceDetails keys and
// whether each holds a number (skupricedetails.md); other keys must begin
// with "x_".
var skuPriceProperties = map[string]bool{
	"CoreCount": true, "DiskMaxIops": true, "DiskSpace": true, "DiskType": false, "GpuCount": true,
	"InstanceType": false, "InstanceSeries": false, "MemorySize": true, "NetworkMaxIops": true,
	"NetworkMaxThroughput": true, "OperatingSystem": false, "Redundancy": false, "StorageClass": false,
}

// nationalCurrencies are the ISO 4217 alphabetic codes of national
// currencies in use (CurrencyFormat: national currency, e.g. USD, EUR).
var nationalCurrencies = set(
	"AED", "AFN", "ALL", "AMD", "ANG", "AOA", "ARS", "AUD", "AWG", "AZN", "BAM", "BBD", "BDT", "BGN", "BHD", "BIF",
	"BMD", "BND", "BOB", "BRL", "BSD", "BTN", "BWP", "BYN", "BZD", "CAD", "CDF", "CHF", "CLP", "CNY", "COP", "CRC",
	"CUP", "CVE", "CZK", "DJF", "DKK", "DOP", "DZD", "EGP", "ERN", "ETB", "EUR", "FJD", "FKP", "GBP", "GEL", "GHS",
	"GIP", "GMD", "GNF", "GTQ", "GYD", "HKD", "HNL", "HTG", "HUF", "IDR", "ILS", "INR", "IQD", "IRR", "ISK", "JMD",
	"JOD", "JPY", "KES", "KGS", "KHR", "KMF", "KPW", "KRW", "KWD", "KYD", "KZT", "LAK", "LBP", "LKR", "LRD", "LSL",
	"LYD", "MAD", "MDL", "MGA", "MKD", "MMK", "MNT", "MOP", "MRU", "MUR", "MVR", "MWK", "MXN", "MYR", "MZN", "NAD",
	"NGN", "NIO", "NOK", "NPR", "NZD", "OMR", "PAB", "PEN", "PGK", "PHP", "PKR", "PLN", "PYG", "QAR", "RON", "RSD",
	"RUB", "RWF", "SAR", "SBD", "SCR", "SDG", "SEK", "SGD", "SHP", "SLE", "SOS", "SRD", "SSP", "STN", "SVC", "SYP",
	"SZL", "THB", "TJS", "TMT", "TND", "TOP", "TRY", "TTD", "TWD", "TZS", "UAH", "UGX", "USD", "UYU", "UZS", "VES",
	"VND", "VUV", "WST", "XAF", "XCD", "XCG", "XOF", "XPF", "YER", "ZAR", "ZMW", "ZWG",
)

func set(vs ...string) map[string]bool {
	m := make(map[string]bool, len(vs))
	for _, v := range vs {
		m[v] = true
	}
	return m
}
