package controllers

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

// ServerSetReconciler runs the engines of a ServerSet and copies the system's state into its status.
type ServerSetReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Recorder record.EventRecorder
	MS       *ManagementServices
	// Refresh is how often the status is re-read from the management service (default 30 s).
	Refresh time.Duration
	// Policy limits the engine images and node paths a ServerSet may use (policy.go).
	Policy EnginePolicy
	// TLS: the control plane's certificates (serverset_tls.go).
	TLS TLSOptions
	// APIReader reads Secrets from the API server (nil: Client; see serverset_tls.go).
	APIReader client.Reader
	// Now is the clock of certificate decisions (nil: time.Now).
	Now func() time.Time
}

// No delete verb on what the operator renders: it never deletes them itself; the garbage
// collector removes them with their ServerSet (owner references). serversets/finalizers update
// lets it set blockOwnerDeletion on those owner references where the
// OwnerReferencesPermissionEnforcement admission plugin runs (OpenShift).
// +kubebuilder:rbac:groups=storage.peregrine.dev,resources=serversets,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.peregrine.dev,resources=serversets/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=storage.peregrine.dev,resources=serversets/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=services;configmaps,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile renders the workload, formats storage on first start and reports the system.
func (r *ServerSetReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	ss := &storagev1.ServerSet{}
	if err := r.Get(ctx, req.NamespacedName, ss); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !ss.DeletionTimestamp.IsZero() {
		// The workload goes with its owner references; pools keep their own finalizers.
		return ctrl.Result{}, nil
	}
	before := ss.DeepCopy()

	if errs := r.Policy.Check(ss); len(errs) > 0 {
		// Nothing is rendered or changed for a ServerSet the operator's configuration does not
		// allow; a workload rendered before the policy changed is left as it is (not updated).
		msg := policyMessage(errs)
		gen := ss.Generation
		setCondition(&ss.Status.Conditions, gen, storagev1.ConditionReady, metav1.ConditionFalse, storagev1.ReasonNotAllowed, msg)
		setCondition(&ss.Status.Conditions, gen, storagev1.ConditionProgressing, metav1.ConditionFalse, storagev1.ReasonNotAllowed, msg)
		ss.Status.ObservedGeneration = gen
		if err := r.Status().Patch(ctx, ss, client.MergeFrom(before)); err != nil {
			return ctrl.Result{}, err
		}
		if old := meta.FindStatusCondition(before.Status.Conditions, storagev1.ConditionReady); old == nil || old.Message != msg {
			r.Recorder.Event(ss, corev1.EventTypeWarning, string(storagev1.ReasonNotAllowed), msg)
		}
		log.Info("ServerSet not allowed by the operator's policy", "reason", msg)
		return ctrl.Result{}, nil
	}

	tlsOut, err := r.controlPlaneTLS(ctx, ss)
	if err != nil {
		setCondition(&ss.Status.Conditions, ss.Generation, storagev1.ConditionControlPlaneTLS, metav1.ConditionFalse, storagev1.ReasonCertificateError, err.Error())
		if perr := r.Status().Patch(ctx, ss, client.MergeFrom(before)); perr != nil {
			log.Error(perr, "status patch after a certificate error")
		}
		r.emitConditionEvents(ss, before)
		return ctrl.Result{}, err
	}
	live, replicas, rollHold, err := r.applyWorkload(ctx, ss, tlsOut.hash)
	if err != nil {
		return ctrl.Result{}, err
	}
	ss.Status.MgmtAddress = mgmtAddress(ss)
	ss.Status.System = systemName(ss)

	msErr := r.observeSystem(ctx, ss)
	if msErr != nil {
		log.Info("management service unreachable", "address", ss.Status.MgmtAddress, "error", msErr.Error())
	}
	r.setConditions(ss, live, replicas, rollHold, msErr)
	setCondition(&ss.Status.Conditions, ss.Generation, storagev1.ConditionControlPlaneTLS, tlsOut.status(), tlsOut.reason, tlsOut.msg)
	ss.Status.ObservedGeneration = ss.Generation

	if err := r.Status().Patch(ctx, ss, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, err
	}
	r.emitConditionEvents(ss, before)
	if msErr != nil {
		// A fresh connection next time, which resolves the name again: the service's pod may be
		// back at another address, and a channel to the old one keeps failing. A short fixed
		// wait rather than the rate limiter's growing backoff: engines start within seconds of
		// each other, and a first lookup made before the pod had an address must not cost minutes.
		r.MS.Forget(ss.Status.MgmtAddress)
		return ctrl.Result{RequeueAfter: unreachableRetry}, nil
	}
	return ctrl.Result{RequeueAfter: r.refresh()}, nil
}

// unreachableRetry is how soon a ServerSet whose management service did not answer is looked at again.
const unreachableRetry = 5 * time.Second

func (r *ServerSetReconciler) refresh() time.Duration {
	if r.Refresh == 0 {
		return 30 * time.Second
	}
	return r.Refresh
}

// applyWorkload creates or updates the ConfigMap, Service, PodDisruptionBudget and StatefulSet.
// It returns the StatefulSet as last observed (its status tells how far a roll has come), the
// replicas it asked for, and, when a rolling upgrade holds only because the system is not whole
// again (rollGate), what it waits for.
func (r *ServerSetReconciler) applyWorkload(ctx context.Context, ss *storagev1.ServerSet, tlsHash string) (*appsv1.StatefulSet, int32, string, error) {
	cm, err := renderConfigMap(ss)
	if err != nil {
		return nil, 0, "", err
	}
	if err := r.apply(ctx, ss, cm, func(existing client.Object) {
		existing.(*corev1.ConfigMap).Data = cm.Data
	}); err != nil {
		return nil, 0, "", err
	}
	svc := renderService(ss)
	if err := r.apply(ctx, ss, svc, func(existing client.Object) {
		e := existing.(*corev1.Service)
		e.Spec.Selector, e.Spec.Ports, e.Spec.PublishNotReadyAddresses = svc.Spec.Selector, svc.Spec.Ports, svc.Spec.PublishNotReadyAddresses
	}); err != nil {
		return nil, 0, "", err
	}
	pdb := renderPDB(ss)
	if err := r.apply(ctx, ss, pdb, func(existing client.Object) {
		existing.(*policyv1.PodDisruptionBudget).Spec = pdb.Spec
	}); err != nil {
		return nil, 0, "", err
	}

	replicas := ss.Spec.Engines
	current := &appsv1.StatefulSet{}
	err = r.Get(ctx, client.ObjectKey{Namespace: ss.Namespace, Name: ss.Name}, current)
	found := err == nil
	switch {
	case found:
		if current.Spec.Replicas != nil && *current.Spec.Replicas > replicas {
			replicas = *current.Spec.Replicas // scaling down is refused; setConditions says why
		}
	case !apierrors.IsNotFound(err):
		return nil, 0, "", err
	}
	desiredHash := templateHash(renderStatefulSet(ss, replicas, 0, configHash(cm), tlsHash).Spec.Template)
	partition, rollHold := int32(0), ""
	if found {
		s := rollState{
			replicas:     replicas,
			partition:    currentPartition(current),
			previousHash: current.Annotations[templateHashKey],
			desiredHash:  desiredHash,
			updated:      current.Status.UpdatedReplicas,
			ready:        current.Status.ReadyReplicas,
			observed:     current.Status.ObservedGeneration >= current.Generation,
		}
		if s.partition > 0 && s.previousHash == s.desiredHash {
			s.systemHealthy, s.systemMessage = r.systemHealthy(ctx, ss, replicas)
		}
		partition = nextPartition(s)
		if s.waitingForSystem() {
			rollHold = s.systemMessage
		}
	}
	sts := renderStatefulSet(ss, replicas, partition, configHash(cm), tlsHash)
	sts.Annotations = map[string]string{templateHashKey: desiredHash}
	if err := r.apply(ctx, ss, sts, func(existing client.Object) {
		e := existing.(*appsv1.StatefulSet)
		e.Spec.Replicas = sts.Spec.Replicas
		e.Spec.Template = sts.Spec.Template
		e.Spec.UpdateStrategy = sts.Spec.UpdateStrategy
		if e.Annotations == nil {
			e.Annotations = map[string]string{}
		}
		e.Annotations[templateHashKey] = desiredHash
	}); err != nil {
		return nil, 0, "", err
	}
	return current, replicas, rollHold, nil
}

// apply creates desired (owned by ss) or, when it exists, lets mutate copy the rendered fields
// onto the existing object; fields set by others (defaults, status) stay.
func (r *ServerSetReconciler) apply(ctx context.Context, ss *storagev1.ServerSet, desired client.Object, mutate func(existing client.Object)) error {
	obj := desired.DeepCopyObject().(client.Object)
	_, err := controllerutil.CreateOrUpdate(ctx, r.Client, obj, func() error {
		if obj.GetResourceVersion() != "" {
			mutate(obj)
		}
		obj.SetLabels(desired.GetLabels())
		return controllerutil.SetControllerReference(ss, obj, r.Scheme)
	})
	if err != nil {
		return fmt.Errorf("serverset %s: apply %T %s: %w", ss.Name, desired, desired.GetName(), err)
	}
	return nil
}

// SetupWithManager registers the reconciler.
func (r *ServerSetReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&storagev1.ServerSet{}).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Named("serverset").
		Complete(r)
}
