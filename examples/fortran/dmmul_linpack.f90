! dmmul and the Linpack solve from Fortran on a worker serving rtpool.lib.linalg, each checked
! against a local computation (matmul; the residual of A x = b).
!   RTPOOL_TOKEN=... RTPOOL_MASTER=host:port ./dmmul_linpack [n]    (n default 100)
! Prints `fortran dmmul n=N max_abs_err=E` and `fortran linpack n=N residual=R`; stops with
! code 1 on a wrong answer, 3 on a failed call.
program dmmul_linpack
  use iso_c_binding
  use rtpool_grpc
  implicit none
  type(grpc_function_handle_t) :: h
  integer(c_int64_t), target :: n
  real(c_double), allocatable, target :: A(:, :), B(:, :), C(:, :), At(:, :), x(:), rhs(:)
  type(c_ptr) :: argv(4)
  character(len=16) :: arg
  integer :: i
  real(c_double) :: err, residual

  n = 100
  if (command_argument_count() > 0) then
    call get_command_argument(1, arg)
    read (arg, *) n
  end if
  allocate(A(n, n), B(n, n), C(n, n), At(n, n), x(n), rhs(n))
  call random_number(A)
  call random_number(B)
  C = 0

  call grpc_check(grpc_initialize(c_null_ptr), "grpc_initialize")

  ! C = A B: the worker sees each column-major matrix transposed, so ask it for B A.
  call grpc_check(grpc_function_handle_default(h, "dmmul" // c_null_char), "handle dmmul")
  argv = [c_loc(n), c_loc(B), c_loc(A), c_loc(C)]
  call grpc_check(rtpool_call_argv(h, argv, 4_c_size_t), "dmmul")
  err = maxval(abs(C - matmul(A, B)))
  print '(a, i0, a, es10.3)', "fortran dmmul n=", n, " max_abs_err=", err
  call grpc_check(grpc_function_handle_destruct(h), "destruct dmmul")
  if (err > 1d-9 * n) error stop 1

  ! Solve A x = b: pass A transposed (row-major A), b InOut becomes x.
  do i = 1, int(n)
    A(i, i) = A(i, i) + n
  end do
  call random_number(rhs)
  x = rhs
  At = transpose(A)
  call grpc_check(grpc_function_handle_default(h, "linpack" // c_null_char), "handle linpack")
  argv(1:3) = [c_loc(n), c_loc(At), c_loc(x)]
  call grpc_check(rtpool_call_argv(h, argv, 3_c_size_t), "linpack")
  residual = maxval(abs(matmul(A, x) - rhs))
  print '(a, i0, a, es10.3)', "fortran linpack n=", n, " residual=", residual
  call grpc_check(grpc_finalize(), "grpc_finalize")
  if (residual > 1d-8 * n) error stop 1
end program
