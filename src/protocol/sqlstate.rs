//! SQLSTATE codes Sluice raises itself (PostgreSQL appendix A).

pub const PROTOCOL_VIOLATION: &str = "08P01";
pub const CONNECTION_FAILURE: &str = "08006";
pub const SQLCLIENT_UNABLE_TO_ESTABLISH: &str = "08001";
pub const INVALID_PASSWORD: &str = "28P01";
pub const INVALID_AUTHORIZATION: &str = "28000";
pub const INVALID_CATALOG_NAME: &str = "3D000";
pub const TOO_MANY_CONNECTIONS: &str = "53300";
pub const QUERY_CANCELED: &str = "57014";
pub const ADMIN_SHUTDOWN: &str = "57P01";
pub const CANNOT_CONNECT_NOW: &str = "57P03";
pub const IDLE_IN_TRANSACTION_TIMEOUT: &str = "25P03";
pub const ACTIVE_SQL_TRANSACTION: &str = "25001";
pub const IN_FAILED_SQL_TRANSACTION: &str = "25P02";
pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
pub const INVALID_PARAMETER_VALUE: &str = "22023";
pub const INTERNAL_ERROR: &str = "XX000";
pub const INVALID_SQL_STATEMENT_NAME: &str = "26000";
pub const DUPLICATE_PREPARED_STATEMENT: &str = "42P05";
pub const CONFIGURATION_LIMIT_EXCEEDED: &str = "53400";
pub const SYNTAX_ERROR: &str = "42601";
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
pub const UNDEFINED_OBJECT: &str = "42704";
pub const CANT_CHANGE_RUNTIME_PARAM: &str = "55P02";
pub const INVALID_CURSOR_NAME: &str = "34000";
pub const CONFIG_FILE_ERROR: &str = "F0000";
