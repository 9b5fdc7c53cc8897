package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// States the operator copies into status from the management service (whose API carries them as
// enums, pkg/mgmtpb), in the words the store's CLI prints.

// PoolState is a Pool's state in status.state.
type PoolState string

const (
	// PoolStateReady: every target of the pool is up and in.
	PoolStateReady PoolState = "ready"
	// PoolStateDegraded: targets are down (excluded) or their engines do not answer.
	PoolStateDegraded PoolState = "degraded"
	// PoolStateReintegrating: targets are back and being brought up to date.
	PoolStateReintegrating PoolState = "reintegrating"
	// PoolStateLost: the management service no longer has the pool (destroyed outside Kubernetes).
	PoolStateLost PoolState = "lost"
)

// ContainerState is a Container's state in status.state.
type ContainerState string

const (
	// ContainerStateReady: the store holds the container.
	ContainerStateReady ContainerState = "ready"
	// ContainerStateLost: the management service no longer has the container.
	ContainerStateLost ContainerState = "lost"
)

// EngineState is a rank's state in the system (a ServerSet's status.engines[].state).
type EngineState string

const (
	// EngineJoined: heartbeating, its storage open.
	EngineJoined EngineState = "joined"
	// EngineStopped: no heartbeat within the timeout, or it said it stops.
	EngineStopped EngineState = "stopped"
	// EngineMaintenance: heartbeating, its storage not open (not formatted, or not openable).
	EngineMaintenance EngineState = "maintenance"
)

// StorageState is a rank's storage as its engine reports it (status.engines[].storageState).
type StorageState string

const (
	StorageReady StorageState = "ready"
	// StorageMaintenance: not formatted, or not openable.
	StorageMaintenance StorageState = "maintenance"
	// StorageDegraded: a device write failed; targets refuse updates until the engine restarts.
	StorageDegraded StorageState = "degraded"
	// StorageUnreachable: the management service could not ask the engine.
	StorageUnreachable StorageState = "unreachable"
)

// ConditionReason is why a condition of a ServerSet, Pool or Container has its status
// (metav1.Condition.Reason); warning events about the same cause carry the same word.
type ConditionReason string

// Reasons of more than one kind.
const (
	// ReasonManagementServiceError (Ready, Pool and Container): a management call failed.
	ReasonManagementServiceError ConditionReason = "ManagementServiceError"
	// ReasonManagementServiceUnreachable (Ready, all kinds; Degraded, ServerSet): the management
	// service did not answer (UNAVAILABLE or DEADLINE_EXCEEDED).
	ReasonManagementServiceUnreachable ConditionReason = "ManagementServiceUnreachable"
	// ReasonNotFoundInManagementService (Ready, Pool and Container; Degraded, Pool): the
	// management service no longer has the object (destroyed outside Kubernetes): it is not
	// re-created, and its status keeps only what names it.
	ReasonNotFoundInManagementService ConditionReason = "NotFoundInManagementService"
	// ReasonDestroyFailed (DeletionBlocked, Pool and Container): the store refused to destroy it.
	ReasonDestroyFailed ConditionReason = "DestroyFailed"
	// ReasonTargetsReintegrating (Degraded, Pool and ServerSet): engines are back and their
	// targets are being brought up to date; they take writes and serve no reads yet.
	ReasonTargetsReintegrating ConditionReason = "TargetsReintegrating"
)

// Pool reasons.
const (
	ReasonServerSetNotFound ConditionReason = "ServerSetNotFound"
	ReasonPoolReady         ConditionReason = "PoolReady"
	// ReasonPoolServing (Ready): degraded or reintegrating, and still serving I/O.
	ReasonPoolServing  ConditionReason = "PoolServing"
	ReasonAllTargetsUp ConditionReason = "AllTargetsUp"
	// ReasonTargetsDown (Degraded): targets of the pool are excluded; their engines stopped
	// answering and their shards are served around.
	ReasonTargetsDown ConditionReason = "TargetsDown"
	// ReasonPoolDegraded and ReasonPoolUnknown (Degraded): the store says degraded, or a state
	// this operator does not know, with no target counted out.
	ReasonPoolDegraded ConditionReason = "PoolDegraded"
	ReasonPoolUnknown  ConditionReason = "PoolUnknown"
	// ReasonContainersExist (DeletionBlocked): Containers still use the pool.
	ReasonContainersExist ConditionReason = "ContainersExist"
)

// Container reasons.
const (
	// ReasonPoolNotReady (Ready): the Pool, its store pool or its ServerSet is not there (yet).
	ReasonPoolNotReady   ConditionReason = "PoolNotReady"
	ReasonContainerReady ConditionReason = "ContainerReady"
)

// ServerSet reasons.
const (
	ReasonWaitingForEngines ConditionReason = "WaitingForEngines"
	ReasonFormatted         ConditionReason = "Formatted"
	// ReasonFormatRefused (StorageFormatted): a device carries a foreign signature or another
	// system's format; the force annotation overwrites it on a first start.
	ReasonFormatRefused    ConditionReason = "FormatRefused"
	ReasonFormatFailed     ConditionReason = "FormatFailed"
	ReasonRankUnreachable  ConditionReason = "RankUnreachable"
	ReasonEnginesDown      ConditionReason = "EnginesDown"
	ReasonAllEnginesUp     ConditionReason = "AllEnginesUp"
	ReasonEnginesJoined    ConditionReason = "EnginesJoined"
	ReasonEnginesNotReady  ConditionReason = "EnginesNotReady"
	ReasonScaleDownRefused ConditionReason = "ScaleDownRefused"
	// ReasonWaitingForSystem (Progressing): a rolling upgrade holds before restarting the next
	// engine until every rank is joined with all its targets up and in.
	ReasonWaitingForSystem ConditionReason = "WaitingForSystem"
	ReasonRollingOut       ConditionReason = "RollingOut"
	ReasonRolledOut        ConditionReason = "RolledOut"
	// ReasonNotAllowed (Ready and Progressing): the ServerSet names an engine image, a host path
	// or a device the operator's configuration does not allow; the message names the field.
	ReasonNotAllowed ConditionReason = "NotAllowed"
)

// ServerSet control-plane TLS reasons (ControlPlaneTLS, and the events about certificates).
const (
	// ReasonCertificatesReady: the CA and every certificate are valid and in place.
	ReasonCertificatesReady ConditionReason = "CertificatesReady"
	// ReasonCARotating: a new CA is being rolled out (trusted everywhere, then signing, then the
	// old one dropped); the message names the stage.
	ReasonCARotating ConditionReason = "CARotating"
	// ReasonInsecureControlPlane: spec.insecureControlPlane; the engines serve gRPC without TLS.
	ReasonInsecureControlPlane ConditionReason = "InsecureControlPlane"
	// ReasonCertificateError: a certificate could not be issued or stored.
	ReasonCertificateError ConditionReason = "CertificateError"
	// Events: a CA made, a certificate issued or replaced (the message says why: missing,
	// forged, wrong identity, expired), a mass renewal, a CA rotation step.
	ReasonCAIssued            ConditionReason = "CAIssued"
	ReasonCertificateIssued   ConditionReason = "CertificateIssued"
	ReasonCertificateReplaced ConditionReason = "CertificateReplaced"
	ReasonCertificatesRenewed ConditionReason = "CertificatesRenewed"
)

// StatusConditions is the Pool's conditions, for the helpers its reconciler shares with the
// Container's.
func (p *Pool) StatusConditions() *[]metav1.Condition { return &p.Status.Conditions }

// ObserveGeneration records that the status was computed for the current generation.
func (p *Pool) ObserveGeneration() { p.Status.ObservedGeneration = p.Generation }

// StatusConditions is the Container's conditions.
func (c *Container) StatusConditions() *[]metav1.Condition { return &c.Status.Conditions }

// ObserveGeneration records that the status was computed for the current generation.
func (c *Container) ObserveGeneration() { c.Status.ObservedGeneration = c.Generation }
